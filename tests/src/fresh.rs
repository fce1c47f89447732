//! The workspace binaries a test runs must be the ones cargo built from the sources in the tree.
//! Cargo hands a test only its own package's binaries (`CARGO_BIN_EXE_*`); the others (payload for
//! the end-to-end tests, payload and the stand-ins for the submitter's) are found next to the test
//! executable and **checked, not built**: a test never runs `cargo build` itself (nested builds, a
//! binary of another profile or feature set), and a binary older than any source it is built from
//! fails the test with the command that fixes it. `cargo test --workspace` (what `scripts/test` and
//! CI run) builds every workspace binary before any test starts, so there they are always fresh.
//!
//! Shared by `e2e` (as `e2e::fresh`) and the submitter's tests (`#[path]`-included), so one rule.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The source paths (relative to the workspace root) a binary of `package` is built from. Manifests
/// and the lock file are left out: an edit that changes nothing cargo builds from (a comment, another
/// package's dependency) does not relink the binary, so it would read as stale for ever.
fn sources(package: &str) -> Vec<&'static str> {
    let own = match package {
        "payload" => "payload/src",
        "submitter" => "submitter/src",
        "e2e" => "tests/src",
        other => panic!("fresh::bin: no source list for package {other}"),
    };
    vec![own, "launch-spec/src"]
}

fn workspace_root() -> PathBuf {
    // Both crates that include this file sit one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Sources no binary is built from: launch-spec's test fixtures (feature `testkit`, enabled only
/// for tests, so `cargo build -p payload` neither compiles them nor relinks when they change).
const NOT_IN_BINARIES: &[&str] = &["launch-spec/src/testkit"];

fn newest(path: &Path, found: &mut Option<(SystemTime, PathBuf)>) {
    if NOT_IN_BINARIES.iter().any(|skip| path.ends_with(skip)) {
        return;
    }
    let Ok(meta) = std::fs::metadata(path) else { return };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            newest(&entry.path(), found);
        }
    } else if let Ok(modified) = meta.modified()
        && found.as_ref().is_none_or(|(t, _)| modified > *t)
    {
        *found = Some((modified, path.to_path_buf()));
    }
}

/// `target/<profile>/<bin>` of workspace package `package`, next to this test executable's parent
/// dir. Panics, naming the fix, when it is missing or older than a source it is built from.
pub(crate) fn bin(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
    let path = profile_dir.join(bin);
    let release = if profile_dir.file_name().is_some_and(|n| n == "release") { " --release" } else { "" };
    let fix = format!("run `cargo build -p {package} --bin {bin}{release}` (or `cargo test --workspace`)");
    let root = workspace_root();
    let roots: Vec<PathBuf> = sources(package).into_iter().map(|relative| root.join(relative)).collect();
    if let Err(problem) = check(&path, &roots) {
        panic!("{problem}: {fix}");
    }
    path
}

/// Whether `binary` exists and is at least as new as every file under `roots`.
pub(crate) fn check(binary: &Path, roots: &[PathBuf]) -> Result<(), String> {
    let built =
        std::fs::metadata(binary).and_then(|m| m.modified()).map_err(|_| format!("{} is missing", binary.display()))?;
    let mut source = None;
    for root in roots {
        newest(root, &mut source);
    }
    match source {
        Some((changed, file)) if changed > built => {
            Err(format!("{} is older than {}", binary.display(), file.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_newer_than_the_binary_is_stale() {
        let dir = std::env::temp_dir().join(format!("fresh-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src")).unwrap();
        let (binary, source) = (dir.join("bin"), dir.join("src/main.rs"));
        std::fs::write(&source, "fn main() {}").unwrap();
        std::fs::write(&binary, "").unwrap();
        let at = |secs| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let set = |path: &Path, secs| std::fs::File::options().write(true).open(path).unwrap().set_modified(at(secs));
        set(&source, 1_000).unwrap();
        set(&binary, 2_000).unwrap();
        assert_eq!(check(&binary, &[dir.join("src")]), Ok(()));
        set(&source, 3_000).unwrap();
        let stale = check(&binary, &[dir.join("src")]).unwrap_err();
        assert!(stale.contains("is older than") && stale.contains("main.rs"), "{stale}");
        assert!(check(&dir.join("missing"), &[]).unwrap_err().contains("is missing"));
        // The test fixtures are no binary's source.
        let kit = dir.join("launch-spec/src/testkit");
        std::fs::create_dir_all(&kit).unwrap();
        std::fs::write(kit.join("mod.rs"), "").unwrap();
        set(&source, 1_000).unwrap();
        set(&kit.join("mod.rs"), 3_000).unwrap();
        assert_eq!(check(&binary, &[dir.join("src"), dir.join("launch-spec/src")]), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
