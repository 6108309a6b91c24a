//! Builds the web dashboard (`web/`, TypeScript bundled by esbuild) and embeds it: the
//! bundle is written to `$OUT_DIR/web` and `$OUT_DIR/web_assets.rs` lists every file with
//! `include_bytes!`, so the collector binary carries the dashboard (nothing to deploy
//! beside it). npm runs only when `web/src`, `web/package*.json`, `web/build.mjs` or
//! `web/tsconfig.json` changed; `npm ci` only when `web/package-lock.json` is newer than
//! `web/node_modules`. `GPUFLEET_WEB_DIST=DIR` embeds a pre-built bundle instead (no npm).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;
use std::{env, fs};

const NEED_NODE: &str = "gpufleet-collector embeds the web dashboard, which is built with npm. \
     Install Node.js >= 18 (it includes npm; https://nodejs.org or `apt-get install nodejs npm`), \
     or set GPUFLEET_WEB_DIST to a folder holding a pre-built bundle (`npm run build` in web/).";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let web = manifest.join("../web");
    for p in [
        "src",
        "package.json",
        "package-lock.json",
        "build.mjs",
        "tsconfig.json",
    ] {
        println!("cargo:rerun-if-changed={}", web.join(p).display());
    }
    println!("cargo:rerun-if-env-changed=GPUFLEET_WEB_DIST");
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let dist = match env::var_os("GPUFLEET_WEB_DIST") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dist = out.join("web");
            build_web(&web, &dist);
            dist
        }
    };
    let mut files = Vec::new();
    collect(&dist, &dist, &mut files);
    files.sort();
    if !files.iter().any(|(rel, _)| rel == "index.html") {
        fail(&format!(
            "the web bundle in {} has no index.html",
            dist.display()
        ));
    }
    let mut code = String::from(
        "/// Every embedded file of the dashboard: (path below the bundle root, bytes, content type).\n\
         pub static ASSETS: &[(&str, &[u8], &str)] = &[\n",
    );
    for (rel, path) in &files {
        let _ = writeln!(
            code,
            "    ({rel:?}, include_bytes!({:?}), {:?}),",
            path.display().to_string(),
            content_type(rel)
        );
    }
    code.push_str("];\n");
    if let Err(e) = fs::write(out.join("web_assets.rs"), code) {
        fail(&format!("cannot write web_assets.rs: {e}"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("{msg}");
}

fn mtime(p: &Path) -> Option<SystemTime> {
    fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn run(cmd: &mut Command, what: &str) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "`{what}` in web/ failed ({s}); see its output above"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fail(&format!("`{what}`: command not found. {NEED_NODE}"))
        }
        Err(e) => fail(&format!("cannot run `{what}`: {e}. {NEED_NODE}")),
    }
}

fn build_web(web: &Path, dist: &Path) {
    let installed = web.join("node_modules/.package-lock.json");
    let stale = match (mtime(&installed), mtime(&web.join("package-lock.json"))) {
        (Some(i), Some(l)) => l > i,
        _ => true,
    };
    if stale {
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(web),
            "npm ci",
        );
    }
    run(
        Command::new("node")
            .arg("build.mjs")
            .env("GPUFLEET_WEB_OUT", dist)
            .current_dir(web),
        "node build.mjs",
    );
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => fail(&format!(
            "cannot read the web bundle {}: {e}",
            dir.display()
        )),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let rel = rel.to_string_lossy().replace('\\', "/");
            let abs = fs::canonicalize(&path).unwrap_or(path);
            files.push((rel, abs));
        }
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or_default() {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "map" => "application/json",
        _ => "application/octet-stream",
    }
}
