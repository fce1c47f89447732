//! The Pinggy pair bank's leases: one file per pair in a directory every node sees (the cluster's
//! `<state_dir>/pinggy`), so two live jobs never hold the same (URL, token) pair.
//!
//! A lease is taken with `O_CREAT|O_EXCL` (atomic on local disks, NFSv3+, Lustre and GPFS — unlike
//! `flock`, which Lustre often keeps node-local), refreshed (mtime) while the job runs and removed at
//! teardown. A job killed by SIGKILL or a node failure leaves its lease behind: one whose mtime is
//! older than `lease_ttl_s`, or whose owner pid is gone on this same node, is stale and is taken
//! over by renaming it away first (only one contender's rename succeeds). Pinggy's own lock message
//! remains the backstop for anything the leases miss.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha1::{Digest, Sha1};

/// Who holds a lease (written into the file as JSON; no secrets).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Owner {
    pub run_tag: String,
    pub slurm_job_id: Option<String>,
    pub node: String,
    pub pid: u32,
    pub public_url: String,
    #[serde(default)]
    pub(crate) acquired_at: String,
}

impl Owner {
    fn id(&self) -> String {
        format!("{}:{}:{}", self.node, self.pid, self.run_tag)
    }

    pub(crate) fn describe(&self) -> String {
        match &self.slurm_job_id {
            Some(job) => format!("job {job} ({}) on {} pid {}", self.run_tag, self.node, self.pid),
            None => format!("{} on {} pid {}", self.run_tag, self.node, self.pid),
        }
    }
}

/// The lease file of a pair: named by its public URL (stable when the bank is reordered).
pub(crate) fn lease_path(dir: &Path, public_url: &str) -> PathBuf {
    let digest = Sha1::digest(public_url.trim_end_matches('/').as_bytes());
    dir.join(format!("pinggy-{}.lease", &hex::encode(digest)[..16]))
}

/// A held lease.
#[derive(Debug)]
pub(crate) struct Lease {
    pub path: PathBuf,
    owner: Owner,
}

/// The outcome of one attempt to lease a pair.
#[derive(Debug)]
pub(crate) enum Acquire {
    Acquired(Lease),
    /// A live job holds it.
    Held(Owner),
}

fn pid_alive(pid: u32) -> bool {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    !matches!(kill(Pid::from_raw(pid as i32), None), Err(nix::errno::Errno::ESRCH))
}

/// Whether an existing lease is stale: too old, unreadable garbage, or (same node) a dead pid.
fn stale(path: &Path, ttl: Duration, me: &Owner) -> (bool, Option<Owner>) {
    let Ok(meta) = std::fs::metadata(path) else { return (false, None) };
    let age = meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).unwrap_or_default();
    let owner: Option<Owner> = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok());
    if age > ttl {
        return (true, owner);
    }
    match &owner {
        Some(o) if o.node == me.node && o.pid != me.pid && !pid_alive(o.pid) => (true, owner),
        Some(_) => (false, owner),
        // Half-written by a contender right now, or garbage: garbage ages out by the TTL.
        None => (false, None),
    }
}

fn create(path: &Path, owner: &Owner) -> std::io::Result<Lease> {
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(path)?;
    let mut owner = owner.clone();
    owner.acquired_at = crate::records::now();
    file.write_all(serde_json::to_string(&owner).unwrap_or_default().as_bytes())?;
    file.sync_all()?;
    Ok(Lease { path: path.to_path_buf(), owner })
}

/// Tries to lease `public_url` for `owner`.
pub(crate) fn try_acquire(dir: &Path, public_url: &str, owner: &Owner, ttl: Duration) -> std::io::Result<Acquire> {
    std::fs::create_dir_all(dir)?;
    let path = lease_path(dir, public_url);
    for _ in 0..2 {
        match create(&path, owner) {
            Ok(lease) => return Ok(Acquire::Acquired(lease)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let (is_stale, holder) = stale(&path, ttl, owner);
        if !is_stale {
            let holder = holder.unwrap_or_else(|| Owner {
                run_tag: "?".into(),
                slurm_job_id: None,
                node: "?".into(),
                pid: 0,
                public_url: public_url.to_string(),
                acquired_at: String::new(),
            });
            return Ok(Acquire::Held(holder));
        }
        let aside = path.with_extension(format!("stale-{}-{}", owner.pid, crate::records::now().replace(':', "")));
        if std::fs::rename(&path, &aside).is_ok() {
            tracing::warn!(lease = %path.display(), holder = ?holder.map(|h| h.describe()), "taking over a stale Pinggy lease");
            let _ = std::fs::remove_file(&aside);
        }
    }
    let (_, holder) = stale(&path, ttl, owner);
    Ok(Acquire::Held(holder.unwrap_or_else(|| owner.clone())))
}

impl Lease {
    /// Whether the file is still ours (another job may have judged us stale and taken it).
    pub(crate) fn still_ours(&self) -> bool {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| serde_json::from_str::<Owner>(&t).ok())
            .is_some_and(|o| o.id() == self.owner.id())
    }

    /// Refreshes the mtime; `false` when the lease is no longer ours.
    pub(crate) fn refresh(&self) -> bool {
        if !self.still_ours() {
            return false;
        }
        std::fs::File::options().write(true).open(&self.path).and_then(|f| f.set_modified(SystemTime::now())).is_ok()
    }

    /// Removes the file if it is still ours.
    pub(crate) fn release(self) {
        if self.still_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(pid: u32, tag: &str) -> Owner {
        Owner {
            run_tag: tag.into(),
            slurm_job_id: Some("7".into()),
            node: "n1".into(),
            pid,
            public_url: "https://a".into(),
            acquired_at: String::new(),
        }
    }

    #[test]
    fn one_holder_at_a_time_and_release() {
        let dir = tempfile::tempdir().unwrap();
        let me = owner(std::process::id(), "a");
        let ttl = Duration::from_secs(600);
        let Acquire::Acquired(lease) = try_acquire(dir.path(), "https://a", &me, ttl).unwrap() else { panic!() };
        // Another live process (our parent shell is alive) on this node cannot take it.
        let other = owner(std::os::unix::process::parent_id(), "b");
        match try_acquire(dir.path(), "https://a/", &other, ttl).unwrap() {
            Acquire::Held(h) => assert_eq!(h.run_tag, "a"),
            Acquire::Acquired(_) => panic!("double lease"),
        }
        // A different pair is free.
        assert!(matches!(try_acquire(dir.path(), "https://b", &other, ttl).unwrap(), Acquire::Acquired(_)));
        assert!(lease.refresh());
        lease.release();
        assert!(matches!(try_acquire(dir.path(), "https://a", &other, ttl).unwrap(), Acquire::Acquired(_)));
    }

    #[test]
    fn dead_pid_on_this_node_and_old_leases_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(600);
        // A pid that cannot exist.
        let dead = owner(0x3fff_fff0, "dead");
        let Acquire::Acquired(old) = try_acquire(dir.path(), "https://a", &dead, ttl).unwrap() else { panic!() };
        let me = owner(std::process::id(), "me");
        let Acquire::Acquired(mine) = try_acquire(dir.path(), "https://a", &me, ttl).unwrap() else {
            panic!("stale lease not taken over")
        };
        assert!(!old.still_ours());
        assert!(!old.refresh());
        old.release();
        assert!(mine.still_ours(), "releasing a lost lease must not remove the new holder's file");
        // Another node's lease ages out by the TTL only.
        let mut remote = owner(1, "remote");
        remote.node = "n2".into();
        let Acquire::Acquired(_r) = try_acquire(dir.path(), "https://c", &remote, ttl).unwrap() else { panic!() };
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(try_acquire(dir.path(), "https://c", &me, ttl).unwrap(), Acquire::Held(_)));
        assert!(matches!(try_acquire(dir.path(), "https://c", &me, Duration::ZERO).unwrap(), Acquire::Acquired(_)));
    }
}
