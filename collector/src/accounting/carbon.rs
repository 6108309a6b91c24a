//! The carbon task: prices every stored energy minute in gCO2.
//!
//! carbon(GPU-minute) = energy (kWh) × intensity of the slot holding the minute, for the
//! node's region × the node's PUE. A pass:
//! 1. lists the energy minutes that need a price (none yet, their energy changed, or priced
//!    with a forecast or an estimate that may since have improved);
//! 2. per provider and region, fetches the slots those minutes need unless the store's
//!    cache already holds them (a forecast is fetched again at most every
//!    `refetch_after`, so the actual replaces it once the provider has it);
//! 3. prices each minute from the slot holding it; when the provider is unreachable or
//!    has no slot, from the last known slot, else the configured `--carbon-g-per-kwh`, and
//!    marks it `estimated` — never zero; with neither, the minute stays unpriced (its
//!    energy shows as unpriced in the API);
//! 4. writes only the prices that changed;
//! 5. prefetches the next 24 h of forecast for every configured region (UK `fw24h`), for
//!    the dashboard's curve and the lowest-intensity window.
//!
//! Static and CSV figures are local: they are priced directly, not cached.

use crate::store::carbon::{CarbonMinute, PendingCarbonMinute, PriceBasis};
use crate::store::{CarbonStore, FleetReads, StoreError, TimeRange};
use gpufleet_carbon::{CarbonConfig, IntensityKind, IntensitySlot, NodeCarbon, ProviderKind};
use gpufleet_core::UnixMs;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

const MINUTE_MS: i64 = 60_000;
const HALF_HOUR_MS: i64 = 1_800_000;

/// How the carbon task runs.
#[derive(Debug, Clone)]
pub struct CarbonOptions {
    /// Providers, regions, PUE per node.
    pub config: Arc<CarbonConfig>,
    /// Time between passes.
    pub interval: Duration,
    /// Least time between two fetches of the same provider and region for minutes that
    /// are already priced by a forecast or an estimate.
    pub refetch_after: Duration,
    /// How far back minutes are (re)priced.
    pub window: Duration,
    /// Time between two prefetches of the next 24 h of forecast.
    pub prefetch_every: Duration,
    /// Most minutes priced per pass.
    pub batch: usize,
}

impl Default for CarbonOptions {
    fn default() -> Self {
        CarbonOptions {
            config: Arc::new(CarbonConfig::default()),
            interval: Duration::from_secs(30),
            refetch_after: Duration::from_secs(15 * 60),
            window: Duration::from_secs(48 * 3600),
            prefetch_every: Duration::from_secs(3600),
            batch: 100_000,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Minutes written (new or changed prices).
    pub priced: usize,
    /// Of which estimated (last known or default).
    pub estimated: usize,
    /// Minutes left without a price (no provider for the node, or nothing known).
    pub unpriced: usize,
    /// Provider errors (each logged with provider and URL).
    pub provider_errors: Vec<String>,
}

/// The carbon pricer; [`spawn`] runs it every `interval`.
pub struct Pricer {
    store: Arc<dyn CarbonStore>,
    /// The nodes' labels (per-node carbon settings).
    fleet: Arc<dyn FleetReads>,
    options: CarbonOptions,
    clock: crate::live::status::Clock,
    /// (provider, region) → when its slots were last fetched.
    fetched: HashMap<(ProviderKind, String), UnixMs>,
    /// (provider, region) → when its forecast was last prefetched.
    prefetched: HashMap<(ProviderKind, String), UnixMs>,
    /// Where the next pass starts listing when the last one got a full batch, so minutes
    /// that cannot be priced yet never starve newer ones; cleared after a short batch.
    cursor: Option<UnixMs>,
}

/// A group of minutes priced by one provider in one region.
struct Group {
    node: NodeCarbon,
    minutes: Vec<(PendingCarbonMinute, f64)>,
}

impl Pricer {
    pub fn new(
        store: Arc<dyn CarbonStore>,
        fleet: Arc<dyn FleetReads>,
        options: CarbonOptions,
        clock: crate::live::status::Clock,
    ) -> Self {
        Pricer {
            store,
            fleet,
            options,
            clock,
            fetched: HashMap::new(),
            prefetched: HashMap::new(),
            cursor: None,
        }
    }

    /// One pass (see the module doc).
    pub async fn run_once(&mut self) -> Result<PassReport, StoreError> {
        let mut report = PassReport::default();
        let config = Arc::clone(&self.options.config);
        if !config.enabled() {
            return Ok(report);
        }
        let now = (self.clock)();
        let labels: HashMap<String, BTreeMap<String, String>> = self
            .fleet
            .nodes()
            .await?
            .into_iter()
            .map(|n| (n.name, n.labels))
            .collect();
        let no_labels = BTreeMap::new();
        let node_carbon = |name: &str, report: &mut PassReport| -> Option<NodeCarbon> {
            match config.node(name, labels.get(name).unwrap_or(&no_labels)) {
                Ok(n) => n,
                Err(e) => {
                    warn!(node = %name, error = %e, "carbon settings of a node");
                    report.provider_errors.push(e.to_string());
                    None
                }
            }
        };

        let window_start = now - self.options.window.as_millis() as i64;
        let since = self.cursor.map_or(window_start, |c| c.max(window_start));
        let pending = self
            .store
            .pending_carbon_minutes(since, self.options.batch)
            .await?;
        self.cursor = if pending.len() >= self.options.batch {
            // Resume after the newest minute listed (minutes are listed oldest first).
            pending.last().map(|m| m.minute_ms + 1)
        } else {
            None
        };
        let mut groups: BTreeMap<(ProviderKind, String, String), Group> = BTreeMap::new();
        let mut per_node: HashMap<String, Option<NodeCarbon>> = HashMap::new();
        for m in pending {
            let nc = per_node
                .entry(m.node_name.clone())
                .or_insert_with(|| node_carbon(&m.node_name, &mut report))
                .clone();
            let Some(nc) = nc else {
                report.unpriced += 1;
                continue;
            };
            let pue = nc.pue;
            let key = (
                nc.settings.kind,
                format!("{:?}", nc.settings),
                nc.region.clone(),
            );
            groups
                .entry(key)
                .or_insert_with(|| Group {
                    node: nc,
                    minutes: Vec::new(),
                })
                .minutes
                .push((m, pue));
        }

        let mut out: Vec<CarbonMinute> = Vec::new();
        for group in groups.into_values() {
            self.price_group(group, now, &mut out, &mut report).await?;
        }
        report.priced = out.len();
        report.estimated = out.iter().filter(|m| m.estimated).count();
        if !out.is_empty() {
            self.store.replace_carbon_minutes(&out).await?;
        }

        // Prefetch the next 24 h of forecast per configured provider and region.
        let mut seen: HashMap<(ProviderKind, String), NodeCarbon> = HashMap::new();
        for name in labels.keys() {
            if let Some(nc) = per_node
                .entry(name.clone())
                .or_insert_with(|| node_carbon(name, &mut report))
                .clone()
            {
                seen.entry((nc.settings.kind, nc.region.clone()))
                    .or_insert(nc);
            }
        }
        let every = self.options.prefetch_every.as_millis() as i64;
        for (key, nc) in seen {
            if !cached(key.0) || self.prefetched.get(&key).is_some_and(|t| now - t < every) {
                continue;
            }
            self.prefetched.insert(key.clone(), now);
            let from = now - now.rem_euclid(HALF_HOUR_MS);
            match nc.provider.forecast_24h(&nc.region, from).await {
                Ok(slots) => self.store.upsert_intensity(&slots).await?,
                Err(e) => {
                    warn!(error = %e, "carbon forecast prefetch failed");
                    report.provider_errors.push(e.to_string());
                }
            }
        }
        Ok(report)
    }

    async fn price_group(
        &mut self,
        group: Group,
        now: UnixMs,
        out: &mut Vec<CarbonMinute>,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        let nc = &group.node;
        let kind = nc.settings.kind;
        let (Some(first), Some(last)) = (
            group.minutes.iter().map(|(m, _)| m.minute_ms).min(),
            group.minutes.iter().map(|(m, _)| m.minute_ms).max(),
        ) else {
            return Ok(());
        };
        let range = TimeRange {
            from_ms: first,
            to_ms: last + MINUTE_MS,
        };
        let slots: Vec<IntensitySlot> = if cached(kind) {
            let mut slots = self.store.intensity_slots(kind, &nc.region, range).await?;
            let uncovered = group
                .minutes
                .iter()
                .any(|(m, _)| !slots.iter().any(|s| s.contains(m.minute_ms)));
            let improvable = slots.iter().any(|s| s.kind == IntensityKind::Forecast)
                || group
                    .minutes
                    .iter()
                    .any(|(m, _)| m.priced.as_ref().is_some_and(|p| p.estimated));
            let key = (kind, nc.region.clone());
            let recently = self
                .fetched
                .get(&key)
                .is_some_and(|t| now - t < self.options.refetch_after.as_millis() as i64);
            if uncovered || (improvable && !recently) {
                self.fetched.insert(key, now);
                match nc
                    .provider
                    .slots(&nc.region, range.from_ms, range.to_ms)
                    .await
                {
                    Ok(fresh) => {
                        debug!(provider = %kind, region = %nc.region, slots = fresh.len(), "fetched intensities");
                        self.store.upsert_intensity(&fresh).await?;
                        slots = self.store.intensity_slots(kind, &nc.region, range).await?;
                    }
                    Err(e) => {
                        warn!(error = %e, "carbon provider failed; pricing from the last known intensity or the default, marked estimated");
                        report.provider_errors.push(e.to_string());
                    }
                }
            }
            slots
        } else {
            match nc
                .provider
                .slots(&nc.region, range.from_ms, range.to_ms)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "carbon provider failed");
                    report.provider_errors.push(e.to_string());
                    Vec::new()
                }
            }
        };

        for (m, pue) in group.minutes {
            let chosen = match gpufleet_carbon::slot_at(&slots, m.minute_ms) {
                Some(s) => Some((s.clone(), PriceBasis::Slot)),
                None => {
                    let last = if cached(kind) {
                        self.store
                            .last_intensity_before(kind, &nc.region, m.minute_ms)
                            .await?
                    } else {
                        None
                    };
                    match (last, nc.settings.g_per_kwh) {
                        (Some(s), _) => Some((s, PriceBasis::LastKnown)),
                        (None, Some(g)) => Some((
                            IntensitySlot {
                                from_ms: m.minute_ms,
                                to_ms: m.minute_ms + MINUTE_MS,
                                g_per_kwh: g,
                                kind: IntensityKind::Actual,
                                factor_type: nc.settings.effective_factor_type(),
                                provider: kind,
                                region: nc.region.clone(),
                                fetched_at_ms: now,
                                estimated: true,
                            },
                            PriceBasis::Default,
                        )),
                        (None, None) => None,
                    }
                }
            };
            let Some((slot, basis)) = chosen else {
                report.unpriced += 1;
                continue;
            };
            let estimated = slot.estimated || basis != PriceBasis::Slot;
            let price = CarbonMinute {
                gpu: m.gpu,
                minute_ms: m.minute_ms,
                energy_mj: m.energy_mj,
                g_per_kwh: slot.g_per_kwh,
                pue,
                carbon_g: carbon_g(m.energy_mj, slot.g_per_kwh, pue),
                provider: kind,
                region: nc.region.clone(),
                kind: slot.kind,
                factor_type: slot.factor_type,
                estimated,
                basis,
                priced_at_ms: now,
            };
            let unchanged = m.priced.as_ref().is_some_and(|p| {
                CarbonMinute {
                    priced_at_ms: now,
                    ..p.clone()
                } == price
            });
            if !unchanged {
                out.push(price);
            }
        }
        Ok(())
    }
}

/// Whether a provider's slots are cached in the store (the internet ones).
fn cached(kind: ProviderKind) -> bool {
    matches!(kind, ProviderKind::Uk | ProviderKind::Electricitymaps)
}

/// gCO2 of `energy_mj` at `g_per_kwh` and `pue` (the crate's pure pricing).
pub use gpufleet_carbon::carbon_g;

/// The background job's name: pricing runs on one collector of those sharing a database.
pub const JOB: &str = "carbon";

/// Runs the pricer every `options.interval` until `stop`.
pub fn spawn(
    store: Arc<dyn CarbonStore>,
    fleet: Arc<dyn FleetReads>,
    options: CarbonOptions,
    clock: crate::live::status::Clock,
    stop: CancellationToken,
) -> JoinHandle<()> {
    if options.config.enabled() {
        info!(
            provider = ?options.config.settings.carbon_provider,
            region = ?options.config.settings.carbon_region,
            pue = options.config.settings.pue,
            overrides = options.config.file.nodes.len(),
            "carbon accounting"
        );
    } else {
        info!(
            "carbon accounting off (no --carbon-provider / --carbon-g-per-kwh): carbon figures are absent"
        );
    }
    let interval = options.interval;
    let mut pricer = Pricer::new(store, fleet, options, clock);
    tokio::spawn(async move {
        loop {
            // A pass dropped at shutdown rolls its transaction back; nothing is half-written.
            let pass = tokio::select! {
                () = stop.cancelled() => return,
                r = pricer.run_once() => r,
            };
            match pass {
                Ok(r) if r.priced > 0 || r.unpriced > 0 => {
                    debug!(
                        priced = r.priced,
                        estimated = r.estimated,
                        unpriced = r.unpriced,
                        "carbon pass"
                    );
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "carbon pass failed; retrying next interval"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grams() {
        // 3.6e9 mJ = 1 kWh; 1 kWh at 200 g/kWh and PUE 1.5 = 300 g.
        assert!((carbon_g(3_600_000_000, 200.0, 1.5) - 300.0).abs() < 1e-9);
        assert_eq!(carbon_g(0, 200.0, 1.0), 0.0);
    }
}
