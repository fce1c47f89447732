//! Secrets (docs/design.md §6.6): the env file, its permission check, the Daytona org split.
//!
//! Values are held only in [`Secrets`], whose `Debug` prints names, never values. Errors name the
//! file, a line number or a variable — never a value.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use launch_spec::OutcomeClass;
use launch_spec::spec::SecretsSpec;
use sha1::{Digest, Sha1};

use crate::failure::Failure;

/// What a plan or a log shows in place of a secret value.
pub(crate) const REDACTED: &str = "<redacted>";

/// Org 1's key (the name Harbor reads).
pub(crate) const DAYTONA_ORG1: &str = "DAYTONA_API_KEY";
/// Org 2's key, handed to Harbor as `DAYTONA_API_KEY` for 3 of 4 jobs.
pub(crate) const DAYTONA_ORG2: &str = "DAYTONA_DATA_API_KEY";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SecretsError {
    #[error(
        "secrets file {path} does not exist: create it (mode 0600) or point secrets.file / $DC_AGENT_SECRET_ENV at it"
    )]
    Missing { path: PathBuf },
    #[error("cannot read secrets file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("secrets file {path} has mode {mode:04o}: it is accessible by group or others; run `chmod 600 {path}`")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("secrets file {path}, line {line}: {problem}")]
    Syntax { path: PathBuf, line: usize, problem: &'static str },
    #[error("secrets file {path} is not a regular file (a FIFO, device or directory): point it at the env file itself")]
    NotRegular { path: PathBuf },
    #[error(
        "secrets file {path} is owned by uid {owner}, not by this user (uid {me}): only a file of your own is trusted; `chown` it or use your own copy"
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("secrets file {path} lacks {name}{why}: add `{name}=...` to it")]
    MissingKey { path: PathBuf, name: String, why: String },
}

impl From<SecretsError> for Failure {
    fn from(err: SecretsError) -> Self {
        Failure::new(OutcomeClass::Secrets, err.to_string())
    }
}

/// Parsed secrets. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct Secrets {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secrets")
            .field("path", &self.path)
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Secrets {
    /// An empty set (nothing needed from a secrets file).
    pub fn none() -> Self {
        Self::default()
    }

    pub(crate) fn from_pairs(path: &Path, pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self { path: path.to_path_buf(), values: pairs.into_iter().collect() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// Every non-empty value, for leak checks and redaction.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.values.values().map(String::as_str).filter(|v| !v.is_empty())
    }

    /// `<redacted>` when `text` is a secret value as a whole, or `NAME=<secret>` (an env item or
    /// `--ae` argument); anything else unchanged. By whole value, never by substring: a secret
    /// `Qwen3` leaves `Qwen/Qwen3-8B` alone, and a 2-character secret is still redacted.
    pub fn redact(&self, text: &str) -> String {
        redact_whole(text, &self.values().collect::<Vec<_>>())
    }

    fn require(&self, name: &str, why: &str) -> Result<&str, SecretsError> {
        self.get(name).filter(|v| launch_spec::envfile::is_given(v)).ok_or_else(|| SecretsError::MissingKey {
            path: self.path.clone(),
            name: name.to_string(),
            why: why.to_string(),
        })
    }
}

/// The secrets file: `secrets.file`, else `$DC_AGENT_SECRET_ENV`, else `~/secrets.env`.
pub(crate) fn secrets_path(spec: &SecretsSpec, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(file) = &spec.file {
        return file.clone();
    }
    if let Some(path) = env("DC_AGENT_SECRET_ENV").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let home = env("HOME").unwrap_or_else(|| "/".to_string());
    Path::new(&home).join("secrets.env")
}

/// `<redacted>` for a whole secret value or a `NAME=<secret>` item (see [`Secrets::redact`]).
pub(crate) fn redact_whole(text: &str, secrets: &[&str]) -> String {
    let is_secret = |v: &str| !v.is_empty() && secrets.contains(&v);
    if is_secret(text) {
        return REDACTED.to_string();
    }
    if let Some((name, value)) = text.split_once('=')
        && is_secret(value)
    {
        return format!("{name}={}", REDACTED);
    }
    text.to_string()
}

// The file's format and size cap live in launch-spec, so preflight reads it exactly as payload does.
#[cfg(test)] // used only by the tests
use launch_spec::envfile::EXPECTED_KV;
pub(crate) use launch_spec::envfile::{MAX_SECRETS_BYTES, parse};

/// Reads the file, refusing one that is not a regular file (opened non-blocking and checked on the
/// open descriptor, so a FIFO fails at once), not owned by this user, or accessible by group or
/// others (like ssh does).
pub(crate) fn load(path: &Path) -> Result<Secrets, SecretsError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let read_err = |err: std::io::Error| SecretsError::Read { path: path.to_path_buf(), reason: err.to_string() };
    let file = match launch_spec::records::open_regular(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(SecretsError::Missing { path: path.to_path_buf() });
        }
        Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => {
            return Err(SecretsError::NotRegular { path: path.to_path_buf() });
        }
        Err(err) => return Err(read_err(err)),
    };
    let meta = file.metadata().map_err(read_err)?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(SecretsError::Owner { path: path.to_path_buf(), owner: meta.uid(), me });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretsError::Permissions { path: path.to_path_buf(), mode });
    }
    let mut text = String::new();
    file.take(MAX_SECRETS_BYTES + 1).read_to_string(&mut text).map_err(read_err)?;
    if text.len() as u64 > MAX_SECRETS_BYTES {
        return Err(read_err(std::io::Error::other(format!("larger than {MAX_SECRETS_BYTES} bytes"))));
    }
    let pairs =
        parse(&text).map_err(|(line, problem)| SecretsError::Syntax { path: path.to_path_buf(), line, problem })?;
    Ok(Secrets::from_pairs(path, pairs))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DaytonaOrg {
    Org1,
    Org2,
}

impl DaytonaOrg {
    /// The org's name as records write it (its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Org1 => "org1",
            Self::Org2 => "org2",
        }
    }

    /// The secrets-file variable holding this org's key.
    pub fn variable(self) -> &'static str {
        match self {
            Self::Org1 => DAYTONA_ORG1,
            Self::Org2 => DAYTONA_ORG2,
        }
    }
}

/// Org 2 for 3 of 4 jobs, deterministically from the job id: sha1(job id) mod 4 ≠ 0 → org 2.
pub(crate) fn choose_daytona_org(job_id: &str) -> DaytonaOrg {
    let digest = Sha1::digest(job_id.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    if u64::from_be_bytes(head) % 4 == 0 { DaytonaOrg::Org1 } else { DaytonaOrg::Org2 }
}

/// Both Daytona keys must be present; returns the chosen org and its key (for Harbor's
/// `DAYTONA_API_KEY`).
pub(crate) fn daytona_key<'a>(secrets: &'a Secrets, job_id: &str) -> Result<(DaytonaOrg, &'a str), SecretsError> {
    let org1 = secrets.require(DAYTONA_ORG1, " (Daytona org 1)")?;
    let org2 = secrets.require(DAYTONA_ORG2, " (Daytona org 2)")?;
    let org = choose_daytona_org(job_id);
    Ok((org, if org == DaytonaOrg::Org1 { org1 } else { org2 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn an_orgs_name_is_its_serialized_name() {
        for org in [DaytonaOrg::Org1, DaytonaOrg::Org2] {
            assert_eq!(serde_json::to_value(org).unwrap(), org.as_str());
        }
    }

    #[test]
    fn parses_exports_quotes_comments() {
        let text = "# comment\n\nexport A=1\nB = 'two words'\nC=\"x\\\"y\"\n  export   D=plain=with=eq\nA=override\n";
        let pairs = parse(text).unwrap();
        let map: BTreeMap<_, _> = pairs.into_iter().collect();
        assert_eq!(map["A"], "override");
        assert_eq!(map["B"], "two words");
        assert_eq!(map["C"], "x\"y");
        assert_eq!(map["D"], "plain=with=eq");
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn syntax_error_names_line_not_content() {
        assert_eq!(parse("A=1\nthis is sekrit\n").unwrap_err().0, 2);
        assert_eq!(parse("1BAD=x\n").unwrap_err().0, 1);
        let err = SecretsError::Syntax { path: "/s.env".into(), line: 2, problem: EXPECTED_KV };
        assert!(!err.to_string().contains("sekrit"));
    }

    #[test]
    fn comments_after_values_follow_bash() {
        let map: BTreeMap<_, _> =
            parse("A=v # c\nB=a#b\nC='v # c' # real comment\nD=\"x # y\"\t# c\nE=#abc\nF= spaced  value   # c\n")
                .unwrap()
                .into_iter()
                .collect();
        assert_eq!(map["A"], "v");
        assert_eq!(map["B"], "a#b");
        assert_eq!(map["C"], "v # c");
        assert_eq!(map["D"], "x # y");
        assert_eq!(map["E"], "#abc");
        assert_eq!(map["F"], "spaced  value");
        assert_eq!(parse("A='open\n").unwrap_err().0, 1);
        assert_eq!(parse("A=ok\nB='x'y\n").unwrap_err().0, 2);
    }

    #[test]
    fn nul_in_a_value_is_a_secrets_error_naming_the_line() {
        let (line, problem) = parse("A=1\nB=x\0y\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(problem.contains("NUL"));
    }

    #[test]
    fn redaction_is_by_whole_value() {
        let secrets = Secrets::from_pairs(
            Path::new("/s.env"),
            [("A".to_string(), "Qwen3".to_string()), ("B".to_string(), "xy".to_string())],
        );
        assert_eq!(secrets.redact("Qwen/Qwen3-8B"), "Qwen/Qwen3-8B");
        assert_eq!(secrets.redact("Qwen3"), "<redacted>");
        assert_eq!(secrets.redact("xy"), "<redacted>");
        assert_eq!(secrets.redact("KEY=xy"), "KEY=<redacted>");
        assert_eq!(secrets.redact("xyz"), "xyz");
    }

    #[test]
    fn fifo_secrets_file_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("secrets.env");
        assert!(std::process::Command::new("mkfifo").args(["-m", "600"]).arg(&fifo).status().unwrap().success());
        assert!(matches!(load(&fifo), Err(SecretsError::NotRegular { .. })));
    }

    fn write(dir: &Path, mode: u32, text: &str) -> PathBuf {
        let path = dir.join("secrets.env");
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn refuses_group_or_world_readable_file_naming_file_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), 0o644, "DAYTONA_API_KEY=topsecret7\n");
        let err = load(&path).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("0644"), "{text}");
        assert!(!text.contains("topsecret7"));
        let path = write(dir.path(), 0o640, "A=b\n");
        assert!(matches!(load(&path), Err(SecretsError::Permissions { mode: 0o640, .. })));
        let path = write(dir.path(), 0o600, "A=b\n");
        assert_eq!(load(&path).unwrap().get("A"), Some("b"));
    }

    #[test]
    fn missing_file_is_named() {
        let err = load(Path::new("/nonexistent/secrets.env")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/secrets.env"));
    }

    #[test]
    fn missing_daytona_key_names_only_the_variable() {
        let secrets =
            Secrets::from_pairs(Path::new("/s.env"), [(DAYTONA_ORG1.to_string(), "org1-secret-value".to_string())]);
        let err = daytona_key(&secrets, "123").unwrap_err();
        let text = err.to_string();
        assert!(text.contains(DAYTONA_ORG2), "{text}");
        assert!(!text.contains("org1-secret-value"), "{text}");
        let secrets =
            Secrets::from_pairs(Path::new("/s.env"), [(DAYTONA_ORG2.to_string(), "org2-secret-value".to_string())]);
        let text = daytona_key(&secrets, "123").unwrap_err().to_string();
        assert!(text.contains("lacks DAYTONA_API_KEY"), "{text}");
        assert!(!text.contains("org2-secret-value"));
    }

    #[test]
    fn org_choice_is_deterministic_and_three_to_one() {
        let n = 20_000;
        let org2 = (0..n).filter(|id| choose_daytona_org(&(1_000_000 + id).to_string()) == DaytonaOrg::Org2).count();
        let share = org2 as f64 / n as f64;
        assert!((share - 0.75).abs() < 0.02, "org2 share {share}");
        for id in ["1", "42", "987654"] {
            assert_eq!(choose_daytona_org(id), choose_daytona_org(id));
        }
    }

    #[test]
    fn chosen_key_is_handed_over() {
        let secrets = Secrets::from_pairs(
            Path::new("/s.env"),
            [(DAYTONA_ORG1.to_string(), "k1".to_string()), (DAYTONA_ORG2.to_string(), "k2".to_string())],
        );
        for id in 0..50 {
            let id = id.to_string();
            let (org, key) = daytona_key(&secrets, &id).unwrap();
            assert_eq!(key, if org == DaytonaOrg::Org1 { "k1" } else { "k2" });
        }
    }

    #[test]
    fn path_precedence() {
        let spec = SecretsSpec { file: None, daytona: true, pass_to_harbor: vec![], pass_to_engine: vec![] };
        let env = |k: &str| match k {
            "DC_AGENT_SECRET_ENV" => Some("/x/keys.env".to_string()),
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        assert_eq!(secrets_path(&spec, &env), PathBuf::from("/x/keys.env"));
        let env = |k: &str| (k == "HOME").then(|| "/home/u".to_string());
        assert_eq!(secrets_path(&spec, &env), PathBuf::from("/home/u/secrets.env"));
        let spec = SecretsSpec { file: Some("/f.env".into()), ..spec };
        assert_eq!(secrets_path(&spec, &env), PathBuf::from("/f.env"));
    }

    #[test]
    fn debug_never_shows_values() {
        let secrets = Secrets::from_pairs(Path::new("/s.env"), [("K".to_string(), "hidden-value".to_string())]);
        assert!(!format!("{secrets:?}").contains("hidden-value"));
        assert_eq!(secrets.redact("hidden-value"), "<redacted>");
    }
}
