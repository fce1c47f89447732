//! Whether the payload binary a job will exec fits the cluster's nodes (docs/install.md): where it
//! is (`$PAYLOAD_BIN`, the profile's `slurm.payload_bin`, else beside this submitter), that it
//! exists and is executable, that its ELF machine is the nodes' architecture (`hardware.arch`,
//! and Slurm's node features where they name one), and that the nodes' glibc has every
//! `GLIBC_x.y` symbol version it needs. Reading and deciding only; preflight asks the site.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, FileHeader};

use crate::config::ClusterProfile;
use crate::config::cluster::Arch;

/// The profile field that names the binary.
pub(crate) const FIELD: &str = "slurm.payload_bin";

/// The payload binary the job will exec, and what chose it (named in every refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PayloadBinary {
    pub path: PathBuf,
    pub origin: Origin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `$PAYLOAD_BIN` in the submitter's shell (wins over the profile).
    Environment,
    /// The profile's `slurm.payload_bin`.
    Profile,
    /// Neither: `payload` beside the running submitter (a build tree, or one install directory).
    BesideSubmitter,
}

impl PayloadBinary {
    /// `$PAYLOAD_BIN` (given as `from_environment`), else the profile's field (`from_profile`,
    /// expanded), else beside `submitter_exe`.
    pub(crate) fn locate(
        from_environment: Option<PathBuf>,
        from_profile: Option<PathBuf>,
        submitter_exe: &Path,
    ) -> Self {
        match (from_environment.filter(|p| !p.as_os_str().is_empty()), from_profile) {
            (Some(path), _) => PayloadBinary { path, origin: Origin::Environment },
            (None, Some(path)) => PayloadBinary { path, origin: Origin::Profile },
            (None, None) => {
                PayloadBinary { path: submitter_exe.with_file_name("payload"), origin: Origin::BesideSubmitter }
            }
        }
    }

    /// What to change, said in the profile's terms.
    fn chosen_by(&self, cluster: &str) -> String {
        match self.origin {
            Origin::Environment => format!("$PAYLOAD_BIN, which overrides {FIELD} of clusters/{cluster}.yaml"),
            Origin::Profile => format!("{FIELD} in clusters/{cluster}.yaml"),
            Origin::BesideSubmitter => format!("beside the submitter: {FIELD} unset in clusters/{cluster}.yaml"),
        }
    }

    /// The fix for a binary that does not fit `arch` nodes.
    fn fix(&self, arch: Arch) -> String {
        let field = if self.origin == Origin::Environment { "$PAYLOAD_BIN" } else { FIELD };
        format!("set {field} to the {}-linux payload of a release (scripts/release, docs/install.md)", arch_name(arch))
    }
}

/// A glibc release, `major.minor` (symbol versions are `GLIBC_2.28`; `getconf` says `glibc 2.28`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Glibc {
    pub major: u32,
    pub minor: u32,
}

impl Glibc {
    /// `2.28`, `2.28.1` (a patch level is ignored: symbol versions never carry it).
    pub(crate) fn parse(text: &str) -> Option<Glibc> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Glibc { major, minor })
    }

    /// The version in `getconf GNU_LIBC_VERSION`'s answer (`glibc 2.28`), else None (musl, no getconf).
    pub(crate) fn from_getconf(stdout: &str) -> Option<Glibc> {
        stdout.lines().find_map(|line| line.trim().strip_prefix("glibc ").and_then(Glibc::parse))
    }
}

impl fmt::Display for Glibc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What the binary's ELF header and version-needs say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElfFacts {
    /// `e_machine` (`EM_X86_64` = 62, `EM_AARCH64` = 183).
    pub machine: u16,
    /// The newest `GLIBC_x.y` among its needed symbol versions; None for a static or non-glibc binary.
    pub glibc: Option<Glibc>,
}

impl ElfFacts {
    pub(crate) fn arch(&self) -> Option<Arch> {
        match self.machine {
            object::elf::EM_X86_64 => Some(Arch::X86_64),
            object::elf::EM_AARCH64 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    fn machine_name(&self) -> String {
        self.arch().map_or_else(|| format!("ELF machine {}", self.machine), |a| arch_name(a).to_string())
    }
}

pub(crate) fn arch_name(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "x86_64",
        Arch::Aarch64 => "aarch64",
    }
}

/// The architecture a Slurm node feature names (`aarch64`, `arm64`, `x86_64`, `amd64`, …), if any.
pub(crate) fn feature_arch(feature: &str) -> Option<Arch> {
    match feature.trim().to_ascii_lowercase().as_str() {
        "x86_64" | "x86-64" | "amd64" => Some(Arch::X86_64),
        "aarch64" | "arm64" => Some(Arch::Aarch64),
        _ => None,
    }
}

/// The features in `sinfo -h -o %f`'s answer: one line per node group, comma-separated,
/// `(null)` for none.
pub(crate) fn features(stdout: &str) -> Vec<String> {
    let mut all: Vec<String> = stdout
        .lines()
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|f| !f.is_empty() && *f != "(null)")
        .map(str::to_string)
        .collect();
    all.sort();
    all.dedup();
    all
}

/// The ELF machine and needed glibc of the 64-bit ELF file at `path`.
pub(crate) fn read_elf(path: &Path) -> Result<ElfFacts, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let file = ElfFile64::<object::Endianness>::parse(&*data).map_err(|e| format!("not a 64-bit ELF file ({e})"))?;
    let endian = file.endian();
    let machine = file.elf_header().e_machine(endian);
    let sections = file.elf_section_table();
    let mut glibc: Option<Glibc> = None;
    let bad = |e: object::read::Error| format!("unreadable ELF version needs ({e})");
    if let Some((needs, link)) = sections.gnu_verneed(endian, &*data).map_err(bad)? {
        let strings = sections.strings(endian, &*data, link).map_err(bad)?;
        for need in needs {
            let (_, auxes) = need.map_err(bad)?;
            for aux in auxes {
                let name = aux.map_err(bad)?.name(endian, strings).map_err(bad)?;
                let found =
                    std::str::from_utf8(name).ok().and_then(|n| n.strip_prefix("GLIBC_")).and_then(Glibc::parse);
                glibc = glibc.max(found);
            }
        }
    }
    Ok(ElfFacts { machine, glibc })
}

/// The file checks, on the login node: exists, executable, a 64-bit ELF for the profile's
/// `hardware.arch`. The one-line refusal names the field and the fix.
pub(crate) fn check_file(binary: &PayloadBinary, cluster: &ClusterProfile) -> Result<ElfFacts, String> {
    let arch = cluster.hardware.arch;
    let said = |problem: String| {
        format!(
            "payload binary {} ({}) {problem}: {}",
            binary.path.display(),
            binary.chosen_by(&cluster.name),
            binary.fix(arch)
        )
    };
    let metadata = std::fs::metadata(&binary.path).map_err(|e| {
        said(if e.kind() == std::io::ErrorKind::NotFound {
            "does not exist".into()
        } else {
            format!("cannot be read: {e}")
        })
    })?;
    if !metadata.is_file() {
        return Err(said("is not a regular file".into()));
    }
    let mode = metadata.permissions().mode();
    if mode & 0o111 == 0 || nix::unistd::access(&binary.path, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(format!(
            "payload binary {} ({}) is not executable (mode {:04o}): `chmod a+rx` it, or {}",
            binary.path.display(),
            binary.chosen_by(&cluster.name),
            mode & 0o7777,
            binary.fix(arch)
        ));
    }
    let facts = read_elf(&binary.path).map_err(said)?;
    if facts.arch() != Some(arch) {
        return Err(said(format!(
            "is a {} binary, but the nodes are {} (hardware.arch)",
            facts.machine_name(),
            arch_name(arch)
        )));
    }
    Ok(facts)
}

/// What preflight learnt about the nodes from Slurm and the site's shell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeFacts {
    /// The partition's node features (`sinfo -o %f`), when Slurm gives any.
    pub(crate) features: Vec<String>,
    /// The glibc the job's shell has (asked through the prelude), when it answered.
    pub glibc: Option<Glibc>,
}

/// The binary against the nodes: features naming another architecture than the binary's (or
/// the profile's), a glibc older than the binary needs. Ok: what was checked, one line.
pub(crate) fn judge(
    binary: &PayloadBinary,
    facts: &ElfFacts,
    nodes: &NodeFacts,
    cluster: &ClusterProfile,
) -> Result<String, String> {
    let arch = cluster.hardware.arch;
    let partition = &cluster.slurm.partition;
    let mut said = vec![format!("{} is {}", binary.path.display(), facts.machine_name())];
    let named: Vec<(&str, Arch)> =
        nodes.features.iter().filter_map(|f| feature_arch(f).map(|a| (f.as_str(), a))).collect();
    if let Some((feature, other)) = named.iter().find(|(_, a)| *a != arch) {
        return Err(format!(
            "Slurm's node features of partition {partition} name `{feature}` (sinfo), but hardware.arch in clusters/{}.yaml is {}: set hardware.arch to {} and {FIELD} to its payload (docs/install.md)",
            cluster.name,
            arch_name(arch),
            arch_name(*other)
        ));
    }
    if let Some((feature, _)) = named.first() {
        said.push(format!("node feature `{feature}` agrees"));
    }
    match (facts.glibc, nodes.glibc) {
        (Some(needs), Some(has)) if needs > has => {
            return Err(format!(
                "payload binary {} ({}) needs GLIBC_{needs}, but the job's shell has glibc {has} (getconf GNU_LIBC_VERSION through slurm.prelude): {}, or build it on the login node (docs/install.md \"Another glibc\")",
                binary.path.display(),
                binary.chosen_by(&cluster.name),
                binary.fix(arch)
            ));
        }
        (Some(needs), Some(has)) => said.push(format!("needs glibc {needs}, the nodes have {has}")),
        (Some(needs), None) => said.push(format!("needs glibc {needs} (the nodes' glibc not answered)")),
        (None, _) => said.push("needs no glibc symbol version".into()),
    }
    Ok(said.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_versions_parse_compare_and_come_from_getconf() {
        assert_eq!(Glibc::parse("2.28"), Some(Glibc { major: 2, minor: 28 }));
        assert_eq!(Glibc::parse("2.28.1"), Some(Glibc { major: 2, minor: 28 }));
        assert!(Glibc::parse("2.9") < Glibc::parse("2.28"), "numeric, not lexical");
        assert_eq!(Glibc::parse("two"), None);
        assert_eq!(Glibc::from_getconf("glibc 2.36\n"), Glibc::parse("2.36"));
        assert_eq!(Glibc::from_getconf("getconf: Unrecognized variable\n"), None);
    }

    #[test]
    fn node_features_name_architectures() {
        assert_eq!(feature_arch("aarch64"), Some(Arch::Aarch64));
        assert_eq!(feature_arch("ARM64"), Some(Arch::Aarch64));
        assert_eq!(feature_arch("x86_64"), Some(Arch::X86_64));
        assert_eq!(feature_arch("gpu"), None);
    }

    fn binary(path: &Path) -> PayloadBinary {
        PayloadBinary { path: path.to_path_buf(), origin: Origin::Profile }
    }

    fn this_machine() -> Arch {
        if cfg!(target_arch = "aarch64") { Arch::Aarch64 } else { Arch::X86_64 }
    }

    fn other_machine() -> Arch {
        if cfg!(target_arch = "aarch64") { Arch::X86_64 } else { Arch::Aarch64 }
    }

    fn cluster(arch: Arch) -> ClusterProfile {
        let mut cluster = crate::testkit::Shipped::load().cluster("jupiter");
        cluster.hardware.arch = arch;
        cluster
    }

    /// Each refusal is one line naming the field and the fix; a fitting binary passes.
    #[test]
    fn the_file_checks_refuse_missing_unexecutable_and_foreign_binaries() {
        let dir = tempfile::tempdir().unwrap();
        let missing = check_file(&binary(&dir.path().join("payload")), &cluster(this_machine())).unwrap_err();
        assert!(
            missing.contains("does not exist") && missing.contains("slurm.payload_bin in clusters/jupiter.yaml"),
            "{missing}"
        );
        assert!(missing.contains("scripts/release") && !missing.contains('\n'), "{missing}");

        let copy = dir.path().join("payload-copy");
        std::fs::copy("/bin/sh", &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
        let unexecutable = check_file(&binary(&copy), &cluster(this_machine())).unwrap_err();
        assert!(
            unexecutable.contains("not executable (mode 0644)") && unexecutable.contains("chmod"),
            "{unexecutable}"
        );

        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        let facts = check_file(&binary(&copy), &cluster(this_machine())).unwrap();
        assert_eq!(facts.arch(), Some(this_machine()));
        let foreign = check_file(&binary(&copy), &cluster(other_machine())).unwrap_err();
        let (here, there) = (arch_name(this_machine()), arch_name(other_machine()));
        assert!(
            foreign.contains(&format!("is a {here} binary, but the nodes are {there} (hardware.arch)")),
            "{foreign}"
        );
        assert!(foreign.contains(&format!("the {there}-linux payload")), "{foreign}");

        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
        let not_elf = check_file(&binary(&text), &cluster(this_machine())).unwrap_err();
        assert!(not_elf.contains("not a 64-bit ELF file"), "{not_elf}");

        let env = PayloadBinary { path: dir.path().join("nope"), origin: Origin::Environment };
        let named = check_file(&env, &cluster(this_machine())).unwrap_err();
        assert!(
            named.contains("$PAYLOAD_BIN, which overrides slurm.payload_bin") && named.contains("set $PAYLOAD_BIN to"),
            "{named}"
        );
    }

    /// Node features naming another architecture, and an older glibc on the nodes, are refused.
    #[test]
    fn the_nodes_features_and_glibc_decide() {
        let arch = Arch::Aarch64;
        let facts = ElfFacts { machine: object::elf::EM_AARCH64, glibc: Glibc::parse("2.28") };
        let bin = binary(Path::new("/sw/eval/0.1.0/aarch64-linux/payload"));
        let nodes = |features: &[&str], glibc: &str| NodeFacts {
            features: features.iter().map(|f| f.to_string()).collect(),
            glibc: Glibc::parse(glibc),
        };
        let ok = judge(&bin, &facts, &nodes(&["gh200", "aarch64"], "2.34"), &cluster(arch)).unwrap();
        assert!(
            ok.contains("node feature `aarch64` agrees") && ok.contains("needs glibc 2.28, the nodes have 2.34"),
            "{ok}"
        );
        let same = judge(&bin, &facts, &nodes(&[], "2.28"), &cluster(arch));
        assert!(same.is_ok(), "{same:?}");

        let features = judge(&bin, &facts, &nodes(&["x86_64"], "2.34"), &cluster(arch)).unwrap_err();
        assert!(
            features.contains("name `x86_64` (sinfo)") && features.contains("set hardware.arch to x86_64"),
            "{features}"
        );

        let newer = ElfFacts { machine: object::elf::EM_AARCH64, glibc: Glibc::parse("2.34") };
        let glibc = judge(&bin, &newer, &nodes(&[], "2.28"), &cluster(arch)).unwrap_err();
        assert!(glibc.contains("needs GLIBC_2.34, but the job's shell has glibc 2.28"), "{glibc}");
        assert!(glibc.contains("slurm.payload_bin") && glibc.contains("docs/install.md"), "{glibc}");
        let unanswered = judge(&bin, &newer, &nodes(&[], ""), &cluster(arch)).unwrap();
        assert!(unanswered.contains("not answered"), "{unanswered}");
    }

    #[test]
    fn sinfo_features_split_and_drop_null() {
        assert_eq!(features("gh200,aarch64\n(null)\naarch64,gpu\n"), ["aarch64", "gh200", "gpu"]);
        assert!(features("(null)\n").is_empty());
    }

    /// The reader against binutils' `readelf` (the oracle the release checks use) on this machine's
    /// executables and, where installed (scripts/install-release-tools.sh), the aarch64 glibc.
    #[test]
    fn the_elf_reader_agrees_with_readelf() {
        let readelf = which::which("readelf").expect("readelf (binutils, which the Rust toolchain's linking needs)");
        let cross = Path::new("/usr/aarch64-linux-gnu/lib/libc.so.6");
        let paths = [Path::new("/bin/sh"), Path::new("/usr/bin/env"), cross];
        for path in paths.into_iter().filter(|p| p.is_file()) {
            let facts = read_elf(path).unwrap();
            let out =
                std::process::Command::new(&readelf).args(["-h", "-V"]).arg(path).env("LC_ALL", "C").output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            // Only the version *needs* (a libc also defines versions).
            let needs = text.split("Version needs section").nth(1).unwrap_or("");
            let highest = needs
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .filter_map(|w| w.strip_prefix("GLIBC_").and_then(Glibc::parse))
                .max();
            assert_eq!(facts.glibc, highest, "{}", path.display());
            let machine = text.lines().find_map(|l| l.trim().strip_prefix("Machine:")).unwrap_or("").trim();
            let expected = match facts.arch() {
                Some(Arch::X86_64) => "Advanced Micro Devices X86-64",
                Some(Arch::Aarch64) => "AArch64",
                None => "none",
            };
            assert_eq!(machine, expected, "{}", path.display());
        }
    }
}
