//! The payload binary a job execs must fit the nodes (issue 30, docs/install.md): a profile whose
//! `slurm.payload_bin` is missing, not executable, built for another architecture, or needs a newer
//! glibc than the job's shell has is refused by `submitter preflight` and by `launch` before sbatch —
//! one line naming the field and the fix, nothing queued, no attempt counted. On the simulated site
//! of `site.rs` (the real local Slurm, Lmod, the real `hf`).

use std::path::{Path, PathBuf};
use std::process::Output;

use submitter::ledger::open_ledger;

use crate::ledger::Store;
use crate::queueing::text;
use crate::site::{MODEL, Site, edit_profile};
use crate::support::binaries;

/// The site, with `slurm.payload_bin` naming `<root>/sw/payload` (a copy of this build's payload
/// unless `install` says otherwise).
fn site_with_payload(install: impl Fn(&Path)) -> Option<(Site, PathBuf)> {
    let site = Site::new(|_| {})?;
    let bin = site.root().join("sw/payload");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    install(&bin);
    edit_profile(
        &site,
        "  export_env: [PAYLOAD_GPU_FIXTURE]\n",
        &format!("  export_env: [PAYLOAD_GPU_FIXTURE]\n  payload_bin: {}\n", bin.display()),
    );
    Some((site, bin))
}

fn copy_payload(to: &Path) {
    std::fs::copy(binaries().join("payload"), to).unwrap();
}

fn preflight(site: &Site) -> Output {
    site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage"], None)
}

/// The `payload` line of `submitter preflight`'s table.
fn payload_line(out: &Output) -> String {
    text(out).lines().find(|l| l.trim_start().starts_with("FAIL") && l.contains(" payload ")).unwrap_or("").to_string()
}

fn nothing_submitted(store: &Store) {
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().is_empty(), "an attempt was counted");
}

/// Missing, not executable, another architecture than `hardware.arch`: `preflight` fails its
/// `payload` check and `launch` refuses before planning any sbatch, each with the field and the fix.
#[test]
fn a_payload_binary_that_cannot_run_on_the_nodes_is_refused_before_sbatch() {
    type Case = (&'static str, fn(&Path), fn(&Site), &'static str);
    let here = if cfg!(target_arch = "aarch64") { "aarch64" } else { "x86_64" };
    let there = if here == "aarch64" { "x86_64" } else { "aarch64" };
    let cases: [Case; 3] = [
        ("missing", |_| {}, |_| {}, "does not exist"),
        (
            "not executable",
            |bin| {
                copy_payload(bin);
                std::fs::set_permissions(bin, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
            },
            |_| {},
            "is not executable (mode 0644)",
        ),
        (
            "another architecture",
            copy_payload,
            // The nodes are GH200s (JUPITER, Vista); the binary is this machine's.
            |site| {
                edit_profile(
                    site,
                    &format!("  arch: {}\n", if cfg!(target_arch = "aarch64") { "aarch64" } else { "x86_64" }),
                    &format!("  arch: {}\n", if cfg!(target_arch = "aarch64") { "x86_64" } else { "aarch64" }),
                )
            },
            "binary, but the nodes are",
        ),
    ];
    for (what, install, tweak, why) in cases {
        let Some((site, bin)) = site_with_payload(install) else { return };
        tweak(&site);
        let out = preflight(&site);
        let line = payload_line(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        assert!(line.contains(why) && line.contains(&bin.display().to_string()), "{what}: {}", text(&out));
        assert!(
            line.contains("slurm.payload_bin in clusters/simsite.yaml") && line.contains("docs/install.md"),
            "{what}: {line}"
        );
        if what == "another architecture" {
            assert!(line.contains(&format!("is a {here} binary, but the nodes are {there} (hardware.arch)")), "{line}");
        }

        let store = Store::sqlite();
        let out = site.launch(&store.spec);
        let printed = text(&out);
        assert!(
            !out.status.success() && printed.contains(why) && printed.contains("slurm.payload_bin"),
            "{what}: {printed}"
        );
        assert_eq!(
            printed.trim().lines().filter(|l| l.contains("payload binary")).count(),
            1,
            "{what}: one line: {printed}"
        );
        assert!(!printed.contains("submitted"), "{what}: {printed}");
        assert!(!site.run_dir().join("launch.json").exists(), "{what}: no spec written");
        nothing_submitted(&store);
    }
}

/// A node whose glibc is older than the binary needs (a RHEL 8 family node has 2.28; this build
/// needs this machine's): asked through the profile's prelude, as the job's shell sees it. The
/// prelude here puts a `getconf` answering as glibc 2.28 first on PATH (there is no older system to
/// ask on this machine); the same launch with the real `getconf` passes.
#[test]
fn a_payload_binary_needing_a_newer_glibc_than_the_nodes_is_refused_before_sbatch() {
    let Some((site, bin)) = site_with_payload(copy_payload) else { return };
    let needs = std::process::Command::new("readelf").arg("-V").arg(&bin).output().unwrap();
    let needs = String::from_utf8_lossy(&needs.stdout).to_string();
    assert!(needs.contains("GLIBC_2.29") || needs.contains("GLIBC_2.3"), "this build needs a glibc newer than 2.28");
    let preflight_ok = preflight(&site);
    assert!(preflight_ok.status.success(), "the real getconf: {}", text(&preflight_ok));
    assert!(text(&preflight_ok).contains("the nodes have"), "{}", text(&preflight_ok));

    let old_node = site.root().join("rhel8-node/bin");
    std::fs::create_dir_all(&old_node).unwrap();
    std::fs::write(
        old_node.join("getconf"),
        "#!/bin/sh\n[ \"$1\" = GNU_LIBC_VERSION ] && exec echo 'glibc 2.28'\nexec /usr/bin/getconf \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(old_node.join("getconf"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let prelude = site.root().join("site.prelude.sh");
    let mut text_of_prelude = std::fs::read_to_string(&prelude).unwrap();
    text_of_prelude.push_str(&format!("export PATH={}:$PATH\n", old_node.display()));
    std::fs::write(&prelude, &text_of_prelude).unwrap();

    let out = preflight(&site);
    let line = payload_line(&out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(line.contains("but the job's shell has glibc 2.28") && line.contains("slurm.payload_bin"), "{line}");

    let store = Store::sqlite();
    let out = site.launch(&store.spec);
    let printed = text(&out);
    assert!(printed.contains("not submitted: preflight failed") && printed.contains("glibc 2.28"), "{printed}");
    assert!(printed.contains("0 submitted"), "{printed}");
    nothing_submitted(&store);
    let record = std::fs::read_to_string(site.run_dir().join("preflight.json")).unwrap();
    assert!(record.contains("\"passed\":false") && record.contains("needs GLIBC_2."), "{record}");
}
