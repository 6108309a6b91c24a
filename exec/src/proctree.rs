//! A process and its descendants, from `<proc_root>/<pid>/stat` (the parent pid is its
//! fourth field). `gpufleet-agent exec` uses it to tell which GPU processes belong to the
//! command it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The parent pid in the text of a `/proc/<pid>/stat` file. The command name (second
/// field) is in parentheses and may itself hold spaces and parentheses, so the fields are
/// counted after the last `)`.
pub fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `root` and every process below it that is alive now, read from `proc_root`. Processes
/// that vanish while the folder is read are skipped.
pub fn descendants(proc_root: &Path, root: u32) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(proc_root) {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some(ppid) = parent_pid(&stat) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut tree = BTreeSet::from([root]);
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if tree.insert(c) {
                todo.push(c);
            }
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(dir: &Path, pid: u32, comm: &str, ppid: u32) {
        let d = dir.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("stat"),
            format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0\n"),
        )
        .expect("write");
    }

    #[test]
    fn parent_pid_survives_odd_command_names() {
        assert_eq!(parent_pid("42 (python) S 7 42 42 0"), Some(7));
        assert_eq!(parent_pid("42 (a) b (c) R 9 42 42 0"), Some(9));
        assert_eq!(parent_pid("42 (x"), None);
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn descendants_are_the_whole_subtree_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        stat(p, 1, "init", 0);
        stat(p, 100, "bash", 1);
        stat(p, 200, "python train.py", 100);
        stat(p, 201, "worker (0)", 200);
        stat(p, 300, "other", 1);
        stat(p, 301, "other-child", 300);
        std::fs::create_dir_all(p.join("self")).expect("mkdir");
        std::fs::create_dir_all(p.join("999")).expect("a pid folder without stat");
        assert_eq!(descendants(p, 100), BTreeSet::from([100, 200, 201]));
        assert_eq!(descendants(p, 201), BTreeSet::from([201]));
        assert_eq!(descendants(p, 4242), BTreeSet::from([4242]));
    }

    #[test]
    fn the_real_proc_knows_this_process() {
        let me = std::process::id();
        assert!(descendants(Path::new("/proc"), me).contains(&me));
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).expect("own stat");
        assert!(parent_pid(&stat).is_some());
    }
}
