//! The real `gpufleet` binary in tmux against a real demo: filter, sort, enter a node,
//! `q` quits.

use crate::common::{start_demo, wait_until};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// tmux, installed when missing (`scripts/need-deb` fails loudly if it cannot).
fn tmux_bin() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/need-deb");
    let out = Command::new(script)
        .args(["tmux", "tmux"])
        .output()
        .expect("run scripts/need-deb");
    assert!(
        out.status.success(),
        "tmux is needed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A tmux server of its own (socket in a temp folder), killed on drop.
struct Tmux {
    bin: PathBuf,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    fn new() -> Tmux {
        let dir = tempfile::tempdir().expect("tempdir");
        Tmux {
            bin: tmux_bin(),
            socket: dir.path().join("tmux.sock"),
            _dir: dir,
        }
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin)
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    fn capture(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }

    async fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        wait_until(what, Duration::from_secs(20), async || {
            let s = self.capture();
            f(&s).then_some(s)
        })
        .await
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_in_tmux_filters_sorts_opens_a_node_and_quits() {
    let demo = start_demo(12, 4).await;
    let tmux = Tmux::new();
    let cmd = format!(
        "TERM=xterm-256color {} top --url {}",
        env!("CARGO_BIN_EXE_gpufleet"),
        demo.url
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &cmd,
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );

    let s = tmux
        .wait_for("the fleet, live", |s| {
            s.contains("gpu-node-12") && s.contains("live")
        })
        .await;
    assert!(s.contains("Nodes 12 (12 online"), "{s}");

    // `/` filters by name or label. The pane is read until a whole frame shows the three
    // rows (a capture can catch a redraw halfway: rows of two frames).
    let rows = |s: &str| s.lines().filter(|l| l.contains("gpu-node-")).count();
    tmux.keys(&["/", "node-1"]);
    let s = tmux
        .wait_for("the filter", |s| {
            s.contains("node-1_") && s.contains("of 12 nodes") && rows(s) == 3
        })
        .await;
    assert_eq!(rows(&s), 3, "gpu-node-10, -11, -12: {s}");
    // Escape alone (a key sent right after it would read as Alt+key).
    tmux.keys(&["Escape"]);
    tmux.wait_for("the filter cleared", |s| !s.contains("Filter:"))
        .await;
    tmux.keys(&["/", "site=lab-west", "Enter"]);
    let s = tmux
        .wait_for("the label filter", |s| s.contains("(6 of 12 nodes)"))
        .await;
    assert!(!s.contains("gpu-node-01 "), "odd nodes are lab-east: {s}");
    tmux.keys(&["Escape"]);
    tmux.wait_for("the filter cleared", |s| !s.contains("Filter:"))
        .await;

    // `p` sorts by power, busiest first: the rows' watts go down. The pane is read until
    // a whole frame shows it (a capture can catch a redraw halfway: rows of two frames).
    let watts = |s: &str| -> Vec<u32> {
        s.lines()
            .filter(|l| l.contains("gpu-node-"))
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_suffix('W').and_then(|n| n.parse().ok()))
            })
            .collect()
    };
    let sorted = |w: &[u32]| w.len() == 12 && w.windows(2).all(|w| w[0] >= w[1]);
    tmux.keys(&["p"]);
    let s = tmux
        .wait_for("the power sort", |s| {
            s.contains("POWERv") && sorted(&watts(s))
        })
        .await;
    assert!(sorted(&watts(&s)), "{s}");

    // Enter opens the selected (first) node: its GPU table and processes.
    let first = s
        .lines()
        .find(|l| l.starts_with("> "))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("a selected row")
        .to_owned();
    tmux.keys(&["Enter"]);
    let s = tmux
        .wait_for("the node view", |s| {
            s.contains("POWER / CAP") && s.contains("PID")
        })
        .await;
    assert!(s.contains(&first), "{first}: {s}");
    assert!(s.contains("EVENT"), "{s}");
    tmux.keys(&["Escape"]);
    tmux.wait_for("the fleet again", |s| s.contains("POWERv"))
        .await;

    tmux.keys(&["q"]);
    wait_until("top to quit", Duration::from_secs(10), async || {
        (!tmux.alive()).then_some(())
    })
    .await;
}
