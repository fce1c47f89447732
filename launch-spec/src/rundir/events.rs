//! `events.jsonl`'s vocabulary: one table ([`event_table!`]'s one invocation) of every kind payload
//! writes, its wire name and the typed body of its `fields`. The kind enum [`EventKind`], the name
//! table and the body enum [`EventBody`] are generated from it, so a kind, its name and its fields
//! cannot drift apart: payload's recorder takes an [`EventBody`] (a misspelt kind or field does not
//! compile) and readers decode the body they want ([`super::Event::decode`]).
//!
//! The wire format is what payload wrote before the bodies were typed, byte for byte: each body's
//! fields are declared in the order payload wrote them (serde_json keeps insertion order here), a
//! field payload wrote as `null` is an `Option` without `skip_serializing_if`, and one it left out
//! when absent has it. Fields nested from payload's own types (the multi-node crossing, a lease's
//! owner) stay JSON values. A body decodes leniently: unknown fields are ignored (a newer payload),
//! a missing `Option` is `None`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gpu::{GpuInfo, GpuProfile};
use crate::records::{GpuChoice, Heartbeat, Outcome, Phase, PostRunRecord, RunProvenance};

/// A body type of one kind: decodes a line of that kind ([`super::Event::decode`]).
pub trait EventFields: Serialize + serde::de::DeserializeOwned + Into<EventBody> {
    const KIND: EventKind;
}

macro_rules! event_table {
    ($( $(#[$doc:meta])* $name:literal => $kind:ident($body:ty), )*) => {
        /// What an `events.jsonl` line records. Names are the wire format (snake_case); a name this
        /// build does not know reads as [`EventKind::Other`] (a newer payload), never as an error.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $( $(#[$doc])* $kind, )*
            Other(String),
        }

        /// Every known kind's wire name.
        pub const EVENT_NAMES: &[(&str, EventKind)] = &[ $( ($name, EventKind::$kind), )* ];

        /// The typed `fields` of a known kind: what payload writes.
        #[derive(Debug, Clone, PartialEq)]
        pub enum EventBody {
            $( $kind($body), )*
        }

        impl EventBody {
            pub fn kind(&self) -> EventKind {
                match self {
                    $( EventBody::$kind(_) => EventKind::$kind, )*
                }
            }

            /// The body as the line's `fields` (a JSON object).
            pub fn to_fields(&self) -> Result<serde_json::Map<String, Value>, serde_json::Error> {
                let value = match self {
                    $( EventBody::$kind(b) => serde_json::to_value(b)?, )*
                };
                match value {
                    Value::Object(map) => Ok(map),
                    other => Err(serde::ser::Error::custom(format!("an event body is an object, not {other}"))),
                }
            }

            /// A known kind's body from its `fields`; `None` for [`EventKind::Other`].
            pub(crate) fn from_fields(
                kind: &EventKind,
                fields: &serde_json::Map<String, Value>,
            ) -> Option<Result<Self, serde_json::Error>> {
                match kind {
                    $( EventKind::$kind => Some(<$body>::deserialize(fields).map(EventBody::$kind)), )*
                    EventKind::Other(_) => None,
                }
            }
        }

        $(
            impl From<$body> for EventBody {
                fn from(body: $body) -> Self {
                    EventBody::$kind(body)
                }
            }

            impl EventFields for $body {
                const KIND: EventKind = EventKind::$kind;
            }
        )*
    };
}

event_table! {
    "started" => Started(Started),
    "secrets_loaded" => SecretsLoaded(SecretsLoaded),
    "gpus" => Gpus(Gpus),
    "port" => Port(Port),
    /// The job's scratch dir on node-local disk was created (`dir`).
    "scratch" => Scratch(Scratch),
    "phase" => Phase(PhaseEntered),
    "engine_spawned" => EngineSpawned(EngineSpawned),
    "engine_ready" => EngineReady(EngineReady),
    "engine_exited" => EngineExited(EngineExited),
    "engine_unhealthy" => EngineUnhealthy(EngineUnhealthy),
    /// Requests in flight and no token for `serve.hang_after_s` (payload's liveness rule).
    "engine_hung" => EngineHung(EngineHung),
    /// While loading, no new `vllm.log` bytes for `serve.load_stall_after_s` (engine_start/stalled).
    "engine_stalled" => EngineStalled(EngineStalled),
    /// While loading, `serve.ready_budget` passed with the load still making progress: the
    /// deadline became the cap `serve.health_timeout_s` (progress is never cut short).
    "ready_budget_exceeded" => ReadyBudgetExceeded(ReadyBudgetExceeded),
    /// A server not of the engine's process tree answered readiness on its port (never taken
    /// for the engine).
    "foreign_server" => ForeignServer(ForeignServer),
    /// A multi-node engine (docs/multinode.md): the other nodes' srun step started, every rank
    /// joined (with the node each runs on), the step ended, the step cancelled at teardown.
    "ranks_spawned" => RanksSpawned(RanksSpawned),
    "ranks_joined" => RanksJoined(RanksJoined),
    "ranks_exited" => RanksExited(RanksExited),
    "ranks_cancelled" => RanksCancelled(RanksCancelled),
    "harbor_config_check" => HarborConfigCheck(HarborConfigCheck),
    "harbor_spawned" => HarborSpawned(HarborSpawned),
    "harbor_exited" => HarborExited(HarborExited),
    "resume_configs_rewritten" => ResumeConfigsRewritten(ResumeConfigsRewritten),
    /// The model revision, program versions and dataset digest payload recorded before Harbor
    /// started (`record`), and why any is missing (`missing`).
    "provenance" => Provenance(Provenance),
    "tunnel_prepared" => TunnelPrepared(TunnelPrepared),
    "tunnel_pair" => TunnelPair(TunnelPair),
    "tunnel_pair_skipped" => TunnelPairSkipped(TunnelPairSkipped),
    "tunnel_spawned" => TunnelSpawned(TunnelSpawned),
    "tunnel_restart" => TunnelRestart(TunnelRestart),
    "tunnel_failed" => TunnelFailed(TunnelFailed),
    "tunnel_url_mismatch" => TunnelUrlMismatch(TunnelUrlMismatch),
    "tunnel_lease_unavailable" => TunnelLeaseUnavailable(TunnelLeaseUnavailable),
    "tunnel_lease_lost" => TunnelLeaseLost(TunnelLeaseLost),
    "tunnel_lease_released" => TunnelLeaseReleased(TunnelLeaseReleased),
    "tunnel_exited" => TunnelExited(TunnelExited),
    "tunnel_connected" => TunnelConnected(TunnelConnected),
    "tunnel_up" => TunnelUp(TunnelUp),
    "signal" => Signal(Signal),
    "teardown_started" => TeardownStarted(TeardownStarted),
    "teardown_done" => TeardownDone(TeardownDone),
    "post_run_skipped" => PostRunSkipped(PostRunSkipped),
    "post_run_started" => PostRunStarted(PostRunStarted),
    "post_run_finished" => PostRunFinished(PostRunFinished),
    "write_failures" => WriteFailures(WriteFailures),
    "outcome" => Outcome(Outcome),
    /// payload's heartbeat counters, at most every [`crate::records::HEARTBEAT_EVENT_EVERY_S`]
    /// (a [`Heartbeat`] without the engine's counters, [`heartbeat`]): the history the team
    /// view's charts draw, since `status.json` holds only the latest heartbeat.
    "heartbeat" => Heartbeat(Heartbeat),
    /// A leg of a shared job (launch_spec::shared): `cancel.request` seen; the engine host said
    /// the engine is gone; the leg uses the host's engine (`engine.json`).
    "cancel_requested" => CancelRequested(CancelRequested),
    "engine_lost" => EngineLost(EngineLost),
    "shared_engine" => SharedEngine(SharedEngine),
    /// The engine host of a shared job: a leg's payload started, ended, was left alone (already
    /// finished) or refused before it could start (its spec unreadable or another engine's).
    "leg_spawned" => LegSpawned(LegSpawned),
    "leg_ended" => LegEnded(LegEnded),
    "leg_skipped" => LegSkipped(LegSkipped),
    "leg_refused" => LegRefused(LegRefused),
}

impl EventKind {
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Other(name) => name,
            known => EVENT_NAMES.iter().find(|(_, k)| k == known).map_or("other", |(n, _)| n),
        }
    }
}

impl From<&str> for EventKind {
    fn from(name: &str) -> Self {
        EVENT_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| EventKind::Other(name.to_string()), |(_, k)| k.clone())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        Ok(EventKind::from(name.as_ref()))
    }
}

/// The body of a `heartbeat` event: the heartbeat without the engine's counters (they stay in
/// `status.json`; the history needs the cumulative counts only).
pub fn heartbeat(hb: &Heartbeat) -> Heartbeat {
    Heartbeat { engine: None, ..hb.clone() }
}

/// A field payload writes as `null` when it has no value but leaves out in other bodies of its
/// kind: present (even `null`) reads as `Some`, absent as `None`, so either line round-trips.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// payload started: its spec, pid, version and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub spec: PathBuf,
    pub pid: u32,
    pub payload_version: String,
    pub slurm_job_id: Option<String>,
    pub node: Option<String>,
}

/// The secrets file read: its path, the names it held (never values), the Daytona org.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretsLoaded {
    pub file: PathBuf,
    pub names: Vec<String>,
    pub daytona_org: Option<String>,
}

/// The GPU decision: the probe, the inventory, the count and profile chosen, the ceiling (payload's
/// `gpu::GpuSelection` is this type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpus {
    /// `nvml`, `fixture:<path>`, or `no NVML: …`.
    pub probe: String,
    pub inventory: Vec<GpuInfo>,
    pub count: u32,
    pub profile: Option<GpuProfile>,
    pub gpu_memory_utilization: f64,
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Gpus {
    /// The choice as `status.json` records it (`gpu`).
    pub fn choice(&self) -> GpuChoice {
        GpuChoice {
            profile: self.profile.as_ref().map(|p| p.name.clone()).unwrap_or_else(|| "none".to_string()),
            gpu_name: self.inventory.first().map(|g| g.name.clone()),
            gpu_count: self.count,
            gpu_memory_utilization: self.gpu_memory_utilization,
            source: self.source.clone(),
        }
    }

    /// The chosen profile's extra vLLM arguments.
    pub fn extra_vllm_args(&self) -> &[String] {
        self.profile.as_ref().map(|p| p.extra_vllm_args.as_slice()).unwrap_or(&[])
    }
}

/// The engine's port and how it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Port {
    pub port: u16,
    pub how: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scratch {
    pub dir: PathBuf,
}

/// The run entered `phase` (`status.json`'s phase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseEntered {
    pub phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineSpawned {
    pub pid: u32,
    pub argv: Vec<String>,
    pub port: u16,
}

/// Readiness: how long the load took, the identity check's share, the ready budget kept or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineReady {
    pub elapsed_ms: u64,
    pub identity_check_ms: f64,
    pub ready_budget_s: Option<u64>,
    pub within_budget: Option<bool>,
}

/// The engine exited: its status, the classified cause, and the phase (`start`, `tunnel`; absent
/// during the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineExited {
    pub status: String,
    pub cause: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineUnhealthy {
    pub consecutive_failures: u32,
}

/// The liveness evidence: the window, the stall, the latest counters and the samples over it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineHung {
    pub hang_after_s: u64,
    pub no_tokens_for_s: f64,
    pub requests_running: u64,
    pub requests_waiting: u64,
    pub generation_tokens: u64,
    pub prompt_tokens: u64,
    pub kv_cache_usage: Option<f64>,
    pub samples: Vec<HungSample>,
}

/// One reading in an [`EngineHung`] window, `at_s` seconds after the stall began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HungSample {
    pub at_s: f64,
    pub requests_running: u64,
    pub requests_waiting: u64,
    pub generation_tokens: u64,
    pub prompt_tokens: u64,
    pub kv_cache_usage: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStalled {
    pub vllm_log_bytes: u64,
    pub silent_for_s: u64,
    pub load_stall_after_s: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyBudgetExceeded {
    pub ready_budget_s: u64,
    pub cap_s: u64,
    pub vllm_log_bytes: u64,
    pub silent_for_s: u64,
    pub load_stall_after_s: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForeignServer {
    pub port: u16,
    pub pids: Vec<i32>,
    pub engine_pid: u32,
}

/// The other nodes' srun step: its pid and argv, how the ranks cross nodes and meet (payload's
/// `multinode::Crossing` and `Rendezvous`, as they serialise), each rank's node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanksSpawned {
    pub pid: u32,
    pub argv: Vec<String>,
    pub crossing: Value,
    pub rendezvous: Value,
    pub ranks: Vec<RankNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankNode {
    pub rank: u32,
    pub node: String,
}

/// The ranks that joined (rank 0 is the engine itself, without a step) and those that did not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanksJoined {
    pub ranks: Vec<JoinedRank>,
    pub missing: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinedRank {
    pub rank: u32,
    pub node: String,
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanksExited {
    pub status: String,
    pub during: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RanksCancelled {
    pub steps: Vec<String>,
}

/// Harbor's `--print-config` check: `result` (`passed`, `skipped`, `rejected`) with the agents
/// checked or the reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarborConfigCheck {
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarborSpawned {
    pub pid: u32,
    pub argv: Vec<String>,
    pub mode: String,
    pub api_base: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarborExited {
    pub status: String,
    pub code: i32,
}

/// A resume's stored configs pointed at this run's `api_base`: each file and how many values changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeConfigsRewritten {
    pub api_base: String,
    pub files: Vec<RewrittenFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewrittenFile {
    pub file: PathBuf,
    pub changed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub record: RunProvenance,
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelPrepared {
    pub kind: String,
    pub socks_port: Option<u16>,
}

/// The Pinggy pair taken: its public URL, the secret's name (never its value), the lease file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelPair {
    pub public_url: String,
    pub secret: String,
    pub lease: Option<PathBuf>,
}

/// A pair passed over: `reason` `missing_secret` (with `secret`), `leased` (with `holder`, the
/// lease's owner as payload's lease module writes it, `null` when unreadable) or a cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelPairSkipped {
    pub public_url: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub holder: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelSpawned {
    pub kind: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub attempt: u32,
    pub public_url: Option<String>,
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelRestart {
    pub kind: String,
    pub restart: u32,
    pub max_restarts: u32,
    pub in_s: f64,
    pub cause: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelFailed {
    pub kind: String,
    pub cause: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelUrlMismatch {
    pub announced: Vec<String>,
    pub public_url: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelLeaseUnavailable {
    pub dir: Option<PathBuf>,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelLeaseLost {
    pub lease: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelLeaseReleased {
    pub lease: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelExited {
    pub kind: String,
    pub status: String,
    pub cause: String,
    pub attempt: u32,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelConnected {
    pub kind: String,
    pub authenticated: bool,
    pub urls: Vec<String>,
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelUp {
    pub kind: String,
    pub public_url: Option<String>,
    pub socks_port: Option<u16>,
    pub check: String,
    pub attempt: u32,
    pub elapsed_ms: u64,
}

/// A signal payload received, and during what (`post_run`; absent during the run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    pub signal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeardownStarted {
    pub grace_s: f64,
    pub harbor_grace_s: f64,
}

/// The teardown's report: how long, whether forced, the groups killed, the pids swept, the
/// signals received and each step (`term`/`gone`/`kill` per group, ms since teardown began).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeardownDone {
    pub elapsed_ms: u64,
    pub forced: bool,
    pub killed_groups: Vec<String>,
    pub swept: Vec<i32>,
    pub clean: bool,
    pub signals: Vec<String>,
    pub steps: Vec<TeardownStep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeardownStep {
    pub ms: u64,
    pub action: String,
    pub role: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostRunSkipped {
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostRunStarted {
    pub pid: u32,
    pub argv: Vec<String>,
    pub timeout_s: u64,
    pub log: PathBuf,
    pub missing_secrets: Vec<String>,
}

/// The post-run step's record (`status.json` `post_run`) and, when it ran, the sweep of its group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostRunFinished {
    #[serde(flatten)]
    pub record: PostRunRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swept: Option<Vec<i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean: Option<bool>,
}

/// Failed writes of the logs, `status.json` and `events.jsonl` (when any).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteFailures {
    pub log: u64,
    pub status: u64,
    pub events: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequested {
    pub file: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineLost {
    pub class: String,
    pub cause: Option<String>,
    pub message: String,
}

/// The host's engine a leg uses (`engine.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedEngine {
    pub group_tag: String,
    pub base_url: String,
    pub engine_pid: u32,
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegSpawned {
    pub run_tag: String,
    pub pid: u32,
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegEnded {
    pub run_tag: String,
    pub status: String,
    pub code: i32,
    pub class: String,
    pub cause: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegSkipped {
    pub run_tag: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegRefused {
    pub run_tag: String,
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::Event;

    /// One line of every kind, as payload wrote it before the bodies were typed (its `json!`
    /// literals, field for field): each decodes to its body and writes back byte for byte.
    const LINES: &[&str] = &[
        r#"{"at":"2026-12-01T10:00:00.000Z","event":"started","fields":{"spec":"/j/r/launch.json","pid":41,"payload_version":"0.1.0","slurm_job_id":"77","node":null}}"#,
        r#"{"at":"t","event":"secrets_loaded","fields":{"file":"/h/.secrets.env","names":["DAYTONA_API_KEY"],"daytona_org":null}}"#,
        r#"{"at":"t","event":"gpus","fields":{"probe":"nvml","inventory":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H100","memory_total_bytes":85899345920}],"count":1,"profile":null,"gpu_memory_utilization":0.9,"source":"default"}}"#,
        r#"{"at":"t","event":"port","fields":{"port":8123,"how":"derived from job id 77"}}"#,
        r#"{"at":"t","event":"scratch","fields":{"dir":"/tmp/evalci-77"}}"#,
        r#"{"at":"t","event":"phase","fields":{"phase":"serving"}}"#,
        r#"{"at":"t","event":"engine_spawned","fields":{"pid":42,"argv":["vllm","serve","m"],"port":8123}}"#,
        r#"{"at":"t","event":"engine_ready","fields":{"elapsed_ms":1200,"identity_check_ms":3.25,"ready_budget_s":null,"within_budget":null}}"#,
        r#"{"at":"t","event":"engine_exited","fields":{"status":"exit code 1","cause":"oom","during":"start"}}"#,
        r#"{"at":"t","event":"engine_unhealthy","fields":{"consecutive_failures":3}}"#,
        r#"{"at":"t","event":"engine_hung","fields":{"hang_after_s":5,"no_tokens_for_s":5.0,"requests_running":2,"requests_waiting":0,"generation_tokens":64,"prompt_tokens":10,"kv_cache_usage":null,"samples":[{"at_s":0.0,"requests_running":2,"requests_waiting":0,"generation_tokens":64,"prompt_tokens":10,"kv_cache_usage":0.5}]}}"#,
        r#"{"at":"t","event":"engine_stalled","fields":{"vllm_log_bytes":300,"silent_for_s":10,"load_stall_after_s":10}}"#,
        r#"{"at":"t","event":"ready_budget_exceeded","fields":{"ready_budget_s":20,"cap_s":3000,"vllm_log_bytes":200,"silent_for_s":0,"load_stall_after_s":10}}"#,
        r#"{"at":"t","event":"foreign_server","fields":{"port":8123,"pids":[9],"engine_pid":42}}"#,
        r#"{"at":"t","event":"ranks_spawned","fields":{"pid":50,"argv":["srun","payload","rank"],"crossing":"ib","rendezvous":{"host":"n1","port":29500},"ranks":[{"rank":0,"node":"n1"},{"rank":1,"node":"n2"}]}}"#,
        r#"{"at":"t","event":"ranks_joined","fields":{"ranks":[{"rank":0,"node":"n1","pid":42},{"rank":1,"node":"n2","pid":7,"step":"77.1"}],"missing":[]}}"#,
        r#"{"at":"t","event":"ranks_exited","fields":{"status":"exit code 1","during":"start"}}"#,
        r#"{"at":"t","event":"ranks_cancelled","fields":{"steps":["77.1"]}}"#,
        r#"{"at":"t","event":"harbor_config_check","fields":{"result":"passed","agents":1}}"#,
        r#"{"at":"t","event":"harbor_spawned","fields":{"pid":60,"argv":["harbor","jobs","start"],"mode":"fresh","api_base":"http://127.0.0.1:8123/v1"}}"#,
        r#"{"at":"t","event":"harbor_exited","fields":{"status":"exit code 0","code":0}}"#,
        r#"{"at":"t","event":"resume_configs_rewritten","fields":{"api_base":"http://x/v1","files":[{"file":"/j/r/config.json","changed":1}]}}"#,
        r#"{"at":"t","event":"provenance","fields":{"record":{"model_revision":"abc"},"missing":["harbor --version: exit 1"]}}"#,
        r#"{"at":"t","event":"tunnel_prepared","fields":{"kind":"pinggy","socks_port":null}}"#,
        r#"{"at":"t","event":"tunnel_pair","fields":{"public_url":"https://a.pinggy.link","secret":"PINGGY_TOKEN_A","lease":null}}"#,
        r#"{"at":"t","event":"tunnel_pair_skipped","fields":{"public_url":"https://a.pinggy.link","reason":"leased","holder":null}}"#,
        r#"{"at":"t","event":"tunnel_spawned","fields":{"kind":"pinggy","pid":70,"argv":["ssh","-F","c"],"attempt":1,"public_url":"https://a.pinggy.link","force":false}}"#,
        r#"{"at":"t","event":"tunnel_restart","fields":{"kind":"pinggy","restart":1,"max_restarts":3,"in_s":2.0,"cause":"connect_timeout"}}"#,
        r#"{"at":"t","event":"tunnel_failed","fields":{"kind":"pinggy","cause":"host_key","message":"host key verification failed"}}"#,
        r#"{"at":"t","event":"tunnel_url_mismatch","fields":{"announced":["https://b.pinggy.link"],"public_url":"https://a.pinggy.link"}}"#,
        r#"{"at":"t","event":"tunnel_lease_unavailable","fields":{"dir":"/locks","error":"permission denied"}}"#,
        r#"{"at":"t","event":"tunnel_lease_lost","fields":{"lease":"/locks/a.lease"}}"#,
        r#"{"at":"t","event":"tunnel_lease_released","fields":{"lease":"/locks/a.lease"}}"#,
        r#"{"at":"t","event":"tunnel_exited","fields":{"kind":"pinggy","status":"exit code 255","cause":"exited","attempt":1,"detail":null}}"#,
        r#"{"at":"t","event":"tunnel_connected","fields":{"kind":"pinggy","authenticated":true,"urls":["https://a.pinggy.link"],"elapsed_ms":900}}"#,
        r#"{"at":"t","event":"tunnel_up","fields":{"kind":"pinggy","public_url":"https://a.pinggy.link","socks_port":null,"check":"200 from /v1/models","attempt":1,"elapsed_ms":1500}}"#,
        r#"{"at":"t","event":"signal","fields":{"signal":"SIGTERM"}}"#,
        r#"{"at":"t","event":"teardown_started","fields":{"grace_s":10.0,"harbor_grace_s":60.0}}"#,
        r#"{"at":"t","event":"teardown_done","fields":{"elapsed_ms":120,"forced":false,"killed_groups":[],"swept":[],"clean":true,"signals":["SIGTERM"],"steps":[{"ms":0,"action":"term","role":"harbor"}]}}"#,
        r#"{"at":"t","event":"post_run_skipped","fields":{"reason":"the run did not finish (the step runs after Harbor exits 0)"}}"#,
        r#"{"at":"t","event":"post_run_started","fields":{"pid":80,"argv":["upload"],"timeout_s":600,"log":"/j/r/post_run.log","missing_secrets":[]}}"#,
        r#"{"at":"t","event":"post_run_finished","fields":{"ok":true,"exit_code":0,"status":"exit code 0","duration_ms":20,"timed_out":false,"killed":false,"swept":[],"clean":true}}"#,
        r#"{"at":"t","event":"write_failures","fields":{"log":0,"status":2,"events":0}}"#,
        r#"{"at":"t","event":"outcome","fields":{"class":"finished","exit_code":0,"message":"Harbor finished","harbor_exit_code":0}}"#,
        r#"{"at":"t","event":"heartbeat","fields":{"at":"2026-12-01T10:01:00.000Z","completions_ok":3,"completions_4xx":0,"completions_5xx":0,"trials_started":1,"trials_finished":0,"trials_errored":0,"engine_healthy":true,"failed_probes":0,"probe_limit":3}}"#,
        r#"{"at":"t","event":"cancel_requested","fields":{"file":"cancel.request"}}"#,
        r#"{"at":"t","event":"engine_lost","fields":{"class":"engine_died","cause":"oom","message":"the shared engine exited"}}"#,
        r#"{"at":"t","event":"shared_engine","fields":{"group_tag":"g","base_url":"http://n1:8123/v1","engine_pid":42,"public_url":null}}"#,
        r#"{"at":"t","event":"leg_spawned","fields":{"run_tag":"leg1","pid":90,"argv":["payload","run"]}}"#,
        r#"{"at":"t","event":"leg_ended","fields":{"run_tag":"leg1","status":"exit code 0","code":0,"class":"ok","cause":null}}"#,
        r#"{"at":"t","event":"leg_skipped","fields":{"run_tag":"leg1","why":"its Harbor job finished before"}}"#,
        r#"{"at":"t","event":"leg_refused","fields":{"run_tag":"leg1","error":"cannot start the leg's payload"}}"#,
    ];

    fn round_trip(line: &str) -> EventBody {
        let event: Event = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        let body = event.body().unwrap_or_else(|| panic!("no typed body: {line}"));
        assert_eq!(body.kind(), event.event);
        let written = serde_json::to_string(&Event::new(event.at.clone(), &body).unwrap()).unwrap();
        assert_eq!(written, line, "not written back byte for byte");
        body
    }

    #[test]
    fn every_kind_round_trips_byte_for_byte() {
        for line in LINES {
            round_trip(line);
        }
        let seen: Vec<EventKind> = LINES.iter().map(|l| serde_json::from_str::<Event>(l).unwrap().event).collect();
        for (name, kind) in EVENT_NAMES {
            assert!(seen.contains(kind), "no line of {name} above");
            assert_eq!(EventKind::from(*name), *kind);
            assert_eq!(kind.as_str(), *name);
        }
    }

    /// Fields payload writes in some bodies of a kind only.
    const OTHER_SHAPES: &[&str] = &[
        r#"{"at":"t","event":"gpus","fields":{"probe":"nvml","inventory":[],"count":0,"profile":null,"gpu_memory_utilization":0.0,"source":"none","note":"no GPU"}}"#,
        r#"{"at":"t","event":"engine_exited","fields":{"status":"exit code 1","cause":"crash"}}"#,
        r#"{"at":"t","event":"signal","fields":{"signal":"SIGUSR1","during":"post_run"}}"#,
        r#"{"at":"t","event":"harbor_config_check","fields":{"result":"rejected","reason":"Unknown option 'x'"}}"#,
        r#"{"at":"t","event":"tunnel_pair_skipped","fields":{"public_url":"u","reason":"missing_secret","secret":"S"}}"#,
        r#"{"at":"t","event":"tunnel_pair_skipped","fields":{"public_url":"u","reason":"leased","holder":{"node":"n","pid":1}}}"#,
        r#"{"at":"t","event":"tunnel_pair_skipped","fields":{"public_url":"u","reason":"auth_failed"}}"#,
        r#"{"at":"t","event":"post_run_finished","fields":{"ok":false,"status":"cannot start: x","duration_ms":0,"timed_out":false,"killed":false}}"#,
    ];

    #[test]
    fn the_other_shapes_of_a_kind_round_trip_too() {
        for line in OTHER_SHAPES {
            round_trip(line);
        }
    }

    #[test]
    fn docs_list_every_kind_and_its_fields() {
        // docs/payload.md "Events": one row per kind, `| `kind` | `Body` | `field`, … |`; a row that
        // points to a record type lists its fields there.
        let doc = include_str!("../../../docs/payload.md");
        let section = &doc[doc.find("### Events").expect("docs/payload.md has an Events section")..];
        let mut rows = std::collections::BTreeMap::new();
        for line in section.lines().skip_while(|l| !l.starts_with("| kind |")).skip(2) {
            let Some(cells) = line.strip_prefix("| `") else { break };
            let (kind, rest) = cells.split_once('`').unwrap();
            let fields = rest.rsplit('|').nth(1).unwrap_or_default().to_string();
            rows.insert(kind.to_string(), fields);
        }
        let names: Vec<&str> = EVENT_NAMES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            rows.keys().map(String::as_str).collect::<Vec<_>>(),
            names.iter().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect::<Vec<_>>()
        );
        let mut written: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
        for line in LINES.iter().chain(OTHER_SHAPES) {
            let e: Event = serde_json::from_str(line).unwrap();
            written.entry(e.event.as_str().to_string()).or_default().extend(e.fields.keys().cloned());
        }
        for (kind, fields) in &rows {
            if fields.contains("record") {
                continue;
            }
            let listed: std::collections::BTreeSet<String> =
                fields.split(',').map(|f| f.trim().trim_end_matches('?').trim_matches('`').to_string()).collect();
            assert_eq!(&listed, &written[kind], "docs/payload.md's row of {kind}");
        }
    }

    #[test]
    fn old_and_newer_lines_still_read() {
        // A field a newer payload adds is ignored; a missing optional one is none; an unknown kind
        // has no body and is kept as `Other`.
        let newer: Event = serde_json::from_str(
            r#"{"at":"t","event":"tunnel_pair","fields":{"public_url":"https://a","secret":"S","lease":null,"region":"eu"}}"#,
        )
        .unwrap();
        assert_eq!(newer.pair_url().as_deref(), Some("https://a"));
        let old: Event = serde_json::from_str(
            r#"{"at":"t","event":"tunnel_pair","fields":{"public_url":"https://a","secret":"S"}}"#,
        )
        .unwrap();
        assert_eq!(old.decode::<TunnelPair>().map(|p| p.lease), Some(None));
        let other: Event = serde_json::from_str(r#"{"at":"t","event":"from_the_future","fields":{"x":1}}"#).unwrap();
        assert_eq!((other.body(), other.event.as_str()), (None, "from_the_future"));
        // A line whose fields do not decode as its kind's body reads, without a body.
        let broken: Event = serde_json::from_str(r#"{"at":"t","event":"phase","fields":{"phase":"flying"}}"#).unwrap();
        assert_eq!((broken.body(), broken.phase()), (None, None));
        assert_eq!(broken.decode::<TunnelPair>(), None, "another kind's body is never decoded");
    }
}
