//! The dialect layer: what the shared queries need from a database, and the few places
//! where SQLite and PostgreSQL differ.
//!
//! Queries are written once, as SQL text both databases accept (numbered `$N`
//! parameters, which sqlx-sqlite binds by number too; `CAST(... AS BIGINT)` where
//! PostgreSQL would sum into `numeric`), and run through [`Sql`] against either backend.
//! Rows are decoded once, through [`Get`]: a column is asked for as the Rust type the
//! domain wants and each backend reads it from its own storage type (PostgreSQL keeps
//! small numbers in `int2`/`int4`, SQLite everything in 64-bit integers). What really
//! differs is a [`Dialect`] method (upserts' `greatest`, many rows as one [`Table`],
//! distinct lists) or a [`Backend`] hook (the hand-tuned sample writes, leases, raw
//! retention).

use super::write::sent::{NodeUpdate, Samples, Written};
use super::{NodeBatch, SqlStore, StoreError, WriteOutcome, lease::held::Lease};
use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgRow, PgValueRef};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, Database, Row, TypeInfo, ValueRef};

/// Which SQL a backend speaks, where the two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The larger of two values (SQLite's scalar `max`, PostgreSQL's `greatest`).
    pub fn greatest(self, a: &str, b: &str) -> String {
        match self {
            Dialect::Sqlite => format!("max({a}, {b})"),
            Dialect::Postgres => format!("greatest({a}, {b})"),
        }
    }

    /// Raises `table`'s watermark `column` of the row keyed by `keys` (comma-separated) to
    /// a new value, never lowering it; parameters: the keys, then the value.
    pub fn raise(self, table: &str, keys: &str, column: &str) -> String {
        let n = keys.split(", ").count() + 1;
        let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
        let max = self.greatest(&format!("{table}.{column}"), &format!("excluded.{column}"));
        format!(
            "INSERT INTO {table} ({keys}, {column}) VALUES ({}) \
             ON CONFLICT ({keys}) DO UPDATE SET {column} = {max}",
            params.join(", ")
        )
    }

    /// The smaller of two values (SQLite's scalar `min`, PostgreSQL's `least`).
    pub fn least(self, a: &str, b: &str) -> String {
        match self {
            Dialect::Sqlite => format!("min({a}, {b})"),
            Dialect::Postgres => format!("least({a}, {b})"),
        }
    }

    /// A process lifetime's `ident` (`process_lives`) from the identity columns of `alias`:
    /// one value per distinct identity, NULL told from ''. Written by the database, the
    /// same expression as in migration 0025, so writers on any collector agree on it.
    pub fn process_ident(self, alias: &str) -> String {
        let cols = format!(
            "{alias}.workload_id, {alias}.process_type, {alias}.user_name, {alias}.command, \
             {alias}.mig_uuid"
        );
        match self {
            Dialect::Sqlite => format!("json_array({cols})"),
            Dialect::Postgres => format!("md5(json_build_array({cols})::text)"),
        }
    }

    /// A FROM item `alias` holding the rows of `table`, as `Sql::bind_table` binds them
    /// from parameter 1 on, with its columns and `o`, each row's position (from 0 on
    /// SQLite, 1 on PostgreSQL: use it to order, not to count).
    pub fn over(self, table: &Table, alias: &str) -> String {
        let names = table.cols.iter().map(|(n, _)| *n);
        match self {
            Dialect::Sqlite => {
                let cols: Vec<String> = names
                    .enumerate()
                    .map(|(i, c)| format!(", json_extract(value, '$[{i}]') AS {c}"))
                    .collect();
                format!(
                    "(SELECT key AS o{} FROM json_each($1)) AS {alias}",
                    cols.concat()
                )
            }
            Dialect::Postgres => {
                let arrays: Vec<String> = (table.cols.iter().enumerate())
                    .map(|(i, (_, c))| format!("${}::{}[]", i + 1, c.pg_type()))
                    .collect();
                format!(
                    "UNNEST({}) WITH ORDINALITY AS {alias}({}, o)",
                    arrays.join(", "),
                    table.names()
                )
            }
        }
    }

    /// The number of the first parameter after `table`'s, as `Sql::bind_table` binds
    /// them (SQLite: one JSON text; PostgreSQL: an array per column).
    pub fn param_after(self, table: &Table) -> usize {
        match self {
            Dialect::Sqlite => 2,
            Dialect::Postgres => table.cols.len() + 1,
        }
    }

    /// A CTE `r` of the request rows of `table` (see [`Dialect::over`]).
    pub fn request_rows(self, table: &Table) -> String {
        let materialized = match self {
            Dialect::Sqlite => " MATERIALIZED",
            Dialect::Postgres => "",
        };
        format!(
            "WITH r AS{materialized} (SELECT * FROM {})",
            self.over(table, "u")
        )
    }

    /// The rows of `table` (aliased `alias`) of request `r`'s series (`key` = `r.id`) in
    /// `[r.from_ms, r.to_ms]` of `time`, in `order`: PostgreSQL reads each request's
    /// newest or oldest `lim` through the index (a lateral with a LIMIT); SQLite joins.
    pub fn rows_per_request(
        self,
        table: &str,
        alias: &str,
        key: &str,
        order: &str,
        lim: &str,
    ) -> String {
        match self {
            Dialect::Sqlite => format!(
                "CROSS JOIN {table} {alias} ON {alias}.{key} = r.id \
                 AND {alias}.ts_ms BETWEEN r.from_ms AND r.to_ms"
            ),
            Dialect::Postgres => format!(
                "CROSS JOIN LATERAL (SELECT * FROM {table} x WHERE x.{key} = r.id \
                 AND x.ts_ms BETWEEN r.from_ms AND r.to_ms ORDER BY {order} LIMIT {lim}) {alias}"
            ),
        }
    }

    /// `expr` ordered byte by byte (SQLite's default; PostgreSQL's `"C"` collation).
    pub fn bytewise(self, expr: &str) -> String {
        match self {
            Dialect::Sqlite => expr.to_owned(),
            Dialect::Postgres => format!("{expr} COLLATE \"C\""),
        }
    }

    /// The distinct values of a text expression over a group, read back with
    /// [`List`].
    pub fn distinct_list(self, expr: &str) -> String {
        match self {
            Dialect::Sqlite => format!("group_concat(DISTINCT {expr})"),
            Dialect::Postgres => format!("array_agg(DISTINCT {expr})"),
        }
    }
}

/// A database the store runs on: how to run a query on it, and the hooks for what is
/// written separately for each (the measured hot paths and the backends' own machinery).
#[async_trait]
pub trait Backend: Database<Row: Get> + Sized {
    /// `/api/v1/health`'s name for it.
    const BACKEND: &'static str;
    const DIALECT: Dialect;
    /// The statement that opens a write transaction (SQLite: `BEGIN IMMEDIATE`, so a
    /// writer never has to upgrade a read lock).
    const BEGIN_WRITE: Option<&'static str>;
    /// Whether several collectors may share one database.
    const SHARED: bool;
    /// What a store on this backend keeps besides its pool.
    type Local: std::fmt::Debug + Send + Sync;

    /// The FIFO queue this process's write transactions take turns in, if the backend
    /// needs one (SQLite admits one writer and is not fair among waiters).
    fn write_gate(local: &Self::Local) -> Option<&tokio::sync::Mutex<()>>;

    fn add<T: Value>(args: &mut Self::Arguments, v: T) -> Result<(), BoxDynError>;
    fn fetch_all<'c>(
        conn: &'c mut Self::Connection,
        sql: String,
        args: Self::Arguments,
    ) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>>;
    fn fetch_optional<'c>(
        conn: &'c mut Self::Connection,
        sql: String,
        args: Self::Arguments,
    ) -> BoxFuture<'c, Result<Option<Self::Row>, sqlx::Error>>;
    /// Rows affected.
    fn execute<'c>(
        conn: &'c mut Self::Connection,
        sql: String,
        args: Self::Arguments,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;

    /// Writes a group commit's GPU, process and host rows, adding the GPU samples it
    /// inserted to `nodes`: the measured hot path, tuned per backend. `fallback`: the
    /// slower way, after this returned [`Written::Fallback`] and the transaction was rolled
    /// back.
    async fn write_samples(
        conn: &mut Self::Connection,
        rows: &Samples<'_>,
        nodes: &mut [NodeUpdate],
        fallback: bool,
    ) -> Result<Written, StoreError>;

    /// [`IngestWrites::write_batches`](super::IngestWrites::write_batches) of at least one
    /// batch ([`SqlStore::write_rounds`] and what the backend does around it).
    async fn write_batches(
        store: &SqlStore<Self>,
        batches: &[NodeBatch],
    ) -> Result<WriteOutcome, StoreError>;

    /// [`JobLeases::try_lead`](super::JobLeases::try_lead).
    async fn try_lead(store: &SqlStore<Self>, job: &str) -> Result<Option<Lease>, StoreError>;

    /// The part of raw retention a backend does wholesale once the horizons are raised
    /// (PostgreSQL drops day partitions); returns what it dropped.
    async fn drop_expired_raw(store: &SqlStore<Self>) -> Result<Vec<String>, StoreError>;

    /// After packing closed minutes older than `before_ms`: what the backend frees
    /// wholesale (PostgreSQL drops the process and host day partitions packing emptied;
    /// SQLite reuses freed pages by itself). Returns what it dropped.
    async fn drop_emptied_raw(
        store: &SqlStore<Self>,
        before_ms: gpufleet_core::UnixMs,
    ) -> Result<Vec<String>, StoreError>;
}

/// A value a shared query can bind on either backend.
pub trait Value: Send {
    fn add_sqlite(self, args: &mut SqliteArguments) -> Result<(), BoxDynError>;
    fn add_pg(self, args: &mut PgArguments) -> Result<(), BoxDynError>;
}

macro_rules! values {
    ($($t:ty),* $(,)?) => {$(
        impl Value for $t {
            fn add_sqlite(self, args: &mut SqliteArguments) -> Result<(), BoxDynError> {
                args.add(self)
            }
            fn add_pg(self, args: &mut PgArguments) -> Result<(), BoxDynError> {
                args.add(self)
            }
        }
    )*};
}

values!(
    i64,
    Option<i64>,
    bool,
    Option<bool>,
    f64,
    Option<f64>,
    String,
    Option<String>,
    &str,
    Option<&str>,
    &String,
    &[u8],
    &Vec<u8>,
);

/// One query of the shared SQL: its text, its arguments as bound so far, and what it is
/// for (the `op` of its [`StoreError::Query`]).
pub struct Sql<DB: Backend> {
    op: &'static str,
    text: String,
    args: DB::Arguments,
    err: Option<BoxDynError>,
}

/// A query doing `op`.
pub fn sql<DB: Backend>(op: &'static str, text: impl Into<String>) -> Sql<DB> {
    Sql {
        op,
        text: text.into(),
        args: DB::Arguments::default(),
        err: None,
    }
}

impl<DB: Backend> Sql<DB> {
    pub fn bind<T: Value>(mut self, v: T) -> Self {
        if self.err.is_none()
            && let Err(e) = DB::add(&mut self.args, v)
        {
            self.err = Some(e);
        }
        self
    }

    /// Binds `table` for [`Dialect::over`]: as its first parameters, before any other.
    pub fn bind_table(mut self, table: Table) -> Self {
        match DB::DIALECT {
            Dialect::Sqlite => match table.json() {
                Ok(json) => self.bind(json),
                Err(e) => {
                    self.err.get_or_insert(e);
                    self
                }
            },
            Dialect::Postgres => table.cols.into_iter().fold(self, |q, (_, c)| q.bind(c)),
        }
    }

    fn parts(self) -> Result<(String, DB::Arguments, &'static str), StoreError> {
        match self.err {
            Some(e) => Err(StoreError::Query {
                op: self.op,
                source: sqlx::Error::Encode(e),
            }),
            None => Ok((self.text, self.args, self.op)),
        }
    }

    pub async fn all(self, conn: &mut DB::Connection) -> Result<Vec<DB::Row>, StoreError> {
        let (text, args, op) = self.parts()?;
        DB::fetch_all(conn, text, args)
            .await
            .map_err(|source| StoreError::Query { op, source })
    }

    pub async fn optional(self, conn: &mut DB::Connection) -> Result<Option<DB::Row>, StoreError> {
        let (text, args, op) = self.parts()?;
        DB::fetch_optional(conn, text, args)
            .await
            .map_err(|source| StoreError::Query { op, source })
    }

    pub async fn one(self, conn: &mut DB::Connection) -> Result<DB::Row, StoreError> {
        let op = self.op;
        self.optional(conn).await?.ok_or(StoreError::Query {
            op,
            source: sqlx::Error::RowNotFound,
        })
    }

    /// Rows affected.
    pub async fn execute(self, conn: &mut DB::Connection) -> Result<u64, StoreError> {
        let (text, args, op) = self.parts()?;
        DB::execute(conn, text, args)
            .await
            .map_err(|source| StoreError::Query { op, source })
    }
}

/// Rows a statement reads as one FROM item ([`Dialect::over`]), sent in one go: on
/// SQLite as one JSON text (an array of rows) read with `json_each`, on PostgreSQL as one
/// array per column read with `UNNEST`. Statement texts do not depend on the row count,
/// so their prepared forms are reused.
#[derive(Default)]
pub struct Table {
    cols: Vec<(&'static str, Cells)>,
    rows: usize,
}

/// One column of a [`Table`].
enum Cells {
    Int(Vec<Option<i64>>),
    /// PostgreSQL `int4`, `int2` and `real` columns, bound as such (SQLite: integers and
    /// reals like any other).
    Int4(Vec<Option<i32>>),
    Int2(Vec<Option<i16>>),
    Real(Vec<Option<f32>>),
    Float(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Flag(Vec<Option<bool>>),
    /// PostgreSQL `bytea` (SQLite's JSON cannot carry bytes).
    Bytes(Vec<Option<Vec<u8>>>),
}

impl Cells {
    fn pg_type(&self) -> &'static str {
        match self {
            Cells::Int(_) => "int8",
            Cells::Int4(_) => "int4",
            Cells::Int2(_) => "int2",
            Cells::Real(_) => "float4",
            Cells::Float(_) => "float8",
            Cells::Text(_) => "text",
            Cells::Flag(_) => "bool",
            Cells::Bytes(_) => "bytea",
        }
    }

    fn json(&self, row: usize) -> Result<serde_json::Value, BoxDynError> {
        fn at<T: Clone + Into<serde_json::Value>>(v: &[Option<T>], r: usize) -> serde_json::Value {
            v.get(r)
                .cloned()
                .flatten()
                .map_or(serde_json::Value::Null, Into::into)
        }
        Ok(match self {
            Cells::Int(v) => at(v, row),
            Cells::Int4(v) => at(v, row),
            Cells::Int2(v) => at(v, row),
            Cells::Real(v) => at(v, row),
            Cells::Float(v) => at(v, row),
            Cells::Text(v) => at(v, row),
            Cells::Flag(v) => at(v, row),
            Cells::Bytes(_) => return Err("bytes cannot be bound as JSON".into()),
        })
    }

    /// Field `row` in PostgreSQL's binary `COPY` format: its length (-1 for NULL), then its
    /// big-endian bytes.
    fn copy_field(&self, row: usize, buf: &mut Vec<u8>) {
        fn bytes(buf: &mut Vec<u8>, v: Option<&[u8]>) {
            // Fields are numbers, names and blobs of a few dozen bytes: far below 2^31.
            let len = v.map_or(-1, |b| i32::try_from(b.len()).unwrap_or(i32::MAX));
            buf.extend_from_slice(&len.to_be_bytes());
            buf.extend_from_slice(v.unwrap_or_default());
        }
        fn at<T: Copy>(v: &[Option<T>], r: usize) -> Option<T> {
            v.get(r).copied().flatten()
        }
        fn be<const N: usize>(buf: &mut Vec<u8>, v: Option<[u8; N]>) {
            bytes(buf, v.as_ref().map(|b| &b[..]));
        }
        match self {
            Cells::Int(v) => be(buf, at(v, row).map(i64::to_be_bytes)),
            Cells::Int4(v) => be(buf, at(v, row).map(i32::to_be_bytes)),
            Cells::Int2(v) => be(buf, at(v, row).map(i16::to_be_bytes)),
            Cells::Real(v) => be(buf, at(v, row).map(f32::to_be_bytes)),
            Cells::Float(v) => be(buf, at(v, row).map(f64::to_be_bytes)),
            Cells::Flag(v) => be(buf, at(v, row).map(|b| [u8::from(b)])),
            Cells::Text(v) => bytes(
                buf,
                v.get(row).and_then(|s| s.as_deref()).map(str::as_bytes),
            ),
            Cells::Bytes(v) => bytes(buf, v.get(row).and_then(|b| b.as_deref())),
        }
    }
}

impl Value for Cells {
    fn add_sqlite(self, _: &mut SqliteArguments) -> Result<(), BoxDynError> {
        Err("tables are bound as JSON on SQLite".into())
    }
    fn add_pg(self, args: &mut PgArguments) -> Result<(), BoxDynError> {
        match self {
            Cells::Int(v) => args.add(v),
            Cells::Int4(v) => args.add(v),
            Cells::Int2(v) => args.add(v),
            Cells::Real(v) => args.add(v),
            Cells::Float(v) => args.add(v),
            Cells::Text(v) => args.add(v),
            Cells::Flag(v) => args.add(v),
            Cells::Bytes(v) => args.add(v),
        }
    }
}

/// A [`Table`] method per column type: `name`'s values, each a `T` or an `Option<T>`.
macro_rules! column_methods {
    ($($method:ident $t:ty => $cells:ident),* $(,)?) => {$(
        pub fn $method<T>(self, name: &'static str, values: impl IntoIterator<Item = T>) -> Table
        where
            T: Into<Option<$t>>,
        {
            self.with(name, values, Cells::$cells)
        }
    )*};
}

impl Table {
    fn with<T: Into<Option<U>>, U>(
        mut self,
        name: &'static str,
        values: impl IntoIterator<Item = T>,
        cells: fn(Vec<Option<U>>) -> Cells,
    ) -> Table {
        let values: Vec<Option<U>> = values.into_iter().map(Into::into).collect();
        self.rows = self.rows.max(values.len());
        self.cols.push((name, cells(values)));
        self
    }

    column_methods!(
        int i64 => Int, int4 i32 => Int4, int2 i16 => Int2, real f32 => Real,
        float f64 => Float, text String => Text, bytes Vec<u8> => Bytes, flag bool => Flag
    );

    /// Integer columns `names` of `rows` (request rows: each as long as `names`).
    pub fn ints(names: &[&'static str], rows: &[Vec<i64>]) -> Table {
        let col = |c: usize| rows.iter().map(move |r| r.get(c).copied());
        (names.iter().enumerate()).fold(Table::default(), |t, (c, name)| t.int(name, col(c)))
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Its column names, comma-separated.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.cols.iter().map(|(n, _)| *n).collect();
        names.join(", ")
    }

    fn json(&self) -> Result<String, BoxDynError> {
        let rows = (0..self.rows).map(|r| {
            let row = self.cols.iter().map(|(_, c)| c.json(r));
            row.collect::<Result<_, _>>().map(serde_json::Value::Array)
        });
        Ok(serde_json::Value::Array(rows.collect::<Result<_, _>>()?).to_string())
    }

    /// The rows in PostgreSQL's binary `COPY` format
    /// (<https://www.postgresql.org/docs/current/sql-copy.html#id-1.9.3.55.9.4>): a header,
    /// then per row the field count and its fields, then a -1 trailer.
    pub fn copy_binary(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(19 + self.rows * (2 + self.cols.len() * 12) + 2);
        buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        buf.extend_from_slice(&[0; 8]); // flags (no OIDs), header extension length
        let fields = i16::try_from(self.cols.len()).unwrap_or(i16::MAX);
        for r in 0..self.rows {
            buf.extend_from_slice(&fields.to_be_bytes());
            for (_, c) in &self.cols {
                c.copy_field(r, &mut buf);
            }
        }
        buf.extend_from_slice(&(-1i16).to_be_bytes());
        buf
    }
}

macro_rules! run {
    ($db:ty, $args:ty, $add:ident) => {
        fn add<T: Value>(args: &mut $args, v: T) -> Result<(), BoxDynError> {
            v.$add(args)
        }
        fn fetch_all<'c>(
            conn: &'c mut Self::Connection,
            sql: String,
            args: $args,
        ) -> BoxFuture<'c, Result<Vec<Self::Row>, sqlx::Error>> {
            Box::pin(sqlx::query_with::<$db, _>(sqlx::AssertSqlSafe(sql), args).fetch_all(conn))
        }
        fn fetch_optional<'c>(
            conn: &'c mut Self::Connection,
            sql: String,
            args: $args,
        ) -> BoxFuture<'c, Result<Option<Self::Row>, sqlx::Error>> {
            Box::pin(
                sqlx::query_with::<$db, _>(sqlx::AssertSqlSafe(sql), args).fetch_optional(conn),
            )
        }
        fn execute<'c>(
            conn: &'c mut Self::Connection,
            sql: String,
            args: $args,
        ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
            Box::pin(async move {
                Ok(sqlx::query_with::<$db, _>(sqlx::AssertSqlSafe(sql), args)
                    .execute(conn)
                    .await?
                    .rows_affected())
            })
        }
    };
}
pub(super) use run;

// ------------------------------------------------------------------ reading columns

/// Reads a column of a row of either backend as the Rust type asked for.
pub trait Get {
    fn get<T: Column>(&self, column: &str) -> Result<T, StoreError>;
}

/// A Rust type a column can be read as, on either backend.
pub trait Column: Sized {
    fn sqlite(row: &SqliteRow, column: &str) -> Result<Self, sqlx::Error>;
    fn pg(row: &PgRow, column: &str) -> Result<Self, sqlx::Error>;
}

fn corrupt(column: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("column {column}: {e}"))
}

impl Get for SqliteRow {
    fn get<T: Column>(&self, column: &str) -> Result<T, StoreError> {
        T::sqlite(self, column).map_err(corrupt(column))
    }
}

impl Get for PgRow {
    fn get<T: Column>(&self, column: &str) -> Result<T, StoreError> {
        T::pg(self, column).map_err(corrupt(column))
    }
}

/// Columns SQLite reads as they are, and PostgreSQL as `pg` says.
macro_rules! columns {
    ($($t:ty => $pg:expr),* $(,)?) => {$(
        impl Column for $t {
            fn sqlite(row: &SqliteRow, column: &str) -> Result<Self, sqlx::Error> {
                row.try_get(column)
            }
            fn pg(row: &PgRow, column: &str) -> Result<Self, sqlx::Error> {
                $pg(row, column)
            }
        }
    )*};
}

columns!(
    String => PgRow::try_get,
    Option<String> => PgRow::try_get,
    bool => PgRow::try_get,
    Option<bool> => PgRow::try_get,
    Vec<u8> => PgRow::try_get,
    Option<Vec<u8>> => PgRow::try_get,
    f64 => PgRow::try_get,
    Option<i64> => pg_int,
    i64 => |row, column| not_null(pg_int(row, column)?, column),
    Option<u32> => pg_u32,
    u32 => |row, column| not_null(pg_u32(row, column)?, column),
    Option<f64> => pg_float,
);

fn not_null<T>(v: Option<T>, column: &str) -> Result<T, sqlx::Error> {
    v.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: Box::new(sqlx::error::UnexpectedNullError),
    })
}

/// How a PostgreSQL cell is stored, as far as the readers below tell widths apart.
#[derive(Clone, Copy)]
enum PgCell {
    Null,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Other,
}

/// `column`'s cell of `row` and how it is stored: looked up once, its type told apart
/// without copying the type's name (every integer and float a store read decodes comes
/// through here).
fn pg_cell<'r>(row: &'r PgRow, column: &str) -> Result<(PgCell, PgValueRef<'r>), sqlx::Error> {
    let raw = row.try_get_raw(column)?;
    let cell = if raw.is_null() {
        PgCell::Null
    } else {
        match raw.type_info().name() {
            "INT2" => PgCell::Int2,
            "INT4" => PgCell::Int4,
            "INT8" => PgCell::Int8,
            "FLOAT4" => PgCell::Float4,
            "FLOAT8" => PgCell::Float8,
            _ => PgCell::Other,
        }
    };
    Ok((cell, raw))
}

/// A cell whose type [`pg_cell`] told, decoded as that type.
fn pg_decode<'r, T: sqlx::Decode<'r, sqlx::Postgres>>(
    raw: PgValueRef<'r>,
    column: &str,
) -> Result<T, sqlx::Error> {
    T::decode(raw).map_err(|source| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source,
    })
}

fn decode_err(column: &str, why: String) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: why.into(),
    }
}

/// An integer of any width (PostgreSQL `int2`/`int4`/`int8`).
fn pg_int(row: &PgRow, column: &str) -> Result<Option<i64>, sqlx::Error> {
    let (cell, raw) = pg_cell(row, column)?;
    Ok(match cell {
        PgCell::Null => None,
        PgCell::Int2 => Some(i64::from(pg_decode::<i16>(raw, column)?)),
        PgCell::Int4 => Some(i64::from(pg_decode::<i32>(raw, column)?)),
        PgCell::Int8 => Some(pg_decode::<i64>(raw, column)?),
        // Not an integer: sqlx's type check says so.
        _ => row.try_get::<Option<i64>, _>(column)?,
    })
}

/// A u32 as PostgreSQL keeps it: as a non-negative `int2` (percentages, P-states), as the
/// same bits in an `int4` (sample tables), or as its value in an `int8` (inventory tables).
fn pg_u32(row: &PgRow, column: &str) -> Result<Option<u32>, sqlx::Error> {
    let (cell, raw) = pg_cell(row, column)?;
    Ok(match cell {
        PgCell::Null => None,
        PgCell::Int2 => {
            let v: i16 = pg_decode(raw, column)?;
            Some(u32::try_from(v).map_err(|_| decode_err(column, format!("negative ({v})")))?)
        }
        PgCell::Int4 => Some(pg_decode::<i32>(raw, column)? as u32),
        _ => {
            let v: i64 = match cell {
                PgCell::Int8 => pg_decode(raw, column)?,
                _ => row.try_get(column)?,
            };
            Some(u32::try_from(v).map_err(|_| decode_err(column, format!("{v} out of range")))?)
        }
    })
}

/// A float as PostgreSQL keeps it (`real` or `double precision`).
fn pg_float(row: &PgRow, column: &str) -> Result<Option<f64>, sqlx::Error> {
    let (cell, raw) = pg_cell(row, column)?;
    Ok(match cell {
        PgCell::Null => None,
        PgCell::Float4 => Some(f64::from(pg_decode::<f32>(raw, column)?)),
        PgCell::Float8 => Some(pg_decode::<f64>(raw, column)?),
        _ => Some(row.try_get::<f64, _>(column)?),
    })
}

/// A host metric kept as a float: SQLite `REAL` (f64), PostgreSQL `real`.
impl Column for Option<f32> {
    fn sqlite(row: &SqliteRow, column: &str) -> Result<Self, sqlx::Error> {
        Ok(row.try_get::<Option<f64>, _>(column)?.map(|v| v as f32))
    }
    fn pg(row: &PgRow, column: &str) -> Result<Self, sqlx::Error> {
        let (cell, raw) = pg_cell(row, column)?;
        Ok(match cell {
            PgCell::Null => None,
            PgCell::Float4 => Some(pg_decode::<f32>(raw, column)?),
            PgCell::Float8 => Some(pg_decode::<f64>(raw, column)? as f32),
            _ => Some(row.try_get::<f64, _>(column)? as f32),
        })
    }
}

/// What [`Dialect::distinct_list`] aggregates (SQLite: comma-separated text, PostgreSQL:
/// a text array); `[]` for NULL.
pub struct List(pub Vec<String>);

impl Column for List {
    fn sqlite(row: &SqliteRow, column: &str) -> Result<Self, sqlx::Error> {
        let s: Option<String> = row.try_get(column)?;
        Ok(List(
            s.map(|s| s.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
        ))
    }
    fn pg(row: &PgRow, column: &str) -> Result<Self, sqlx::Error> {
        Ok(List(
            row.try_get::<Option<Vec<String>>, _>(column)?
                .unwrap_or_default(),
        ))
    }
}

/// Reads through [`Get`] with the conversions the domain needs.
pub trait GetExt: Get {
    /// A u64 kept as the i64 with the same bits.
    fn u64_bits(&self, column: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.get::<Option<i64>>(column)?.map(|v| v as u64))
    }

    /// A non-negative integer as u64 (energies and sums are never negative; a negative
    /// value means the row was tampered with).
    fn nonneg(&self, column: &str) -> Result<u64, StoreError> {
        let v: i64 = self.get(column)?;
        u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
    }

    /// A flag: SQLite keeps 0/1 integers, PostgreSQL booleans.
    fn flag(&self, column: &str) -> Result<bool, StoreError> {
        self.get(column)
    }
}

impl<R: Get> GetExt for R {}

/// Inserts `rows` into `table`, with `tail` (ordering, conflict handling) after the
/// SELECT; returns how many were new.
pub(crate) async fn insert_rows<DB: Backend>(
    conn: &mut DB::Connection,
    op: &'static str,
    table: &str,
    rows: Table,
    tail: &str,
) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let names = rows.names();
    sql::<DB>(
        op,
        format!(
            "INSERT INTO {table} ({names}) SELECT {names} FROM {} WHERE true {tail}",
            DB::DIALECT.over(&rows, "v"),
        ),
    )
    .bind_table(rows)
    .execute(conn)
    .await
}
