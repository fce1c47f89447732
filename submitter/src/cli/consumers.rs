//! Who hears a command's events (docs/design.md §0, "The reconcile"): the team database the
//! state changes are mirrored to, and the notifier that tells people. `launch`, `sync`, `cancel`
//! and `remediate` open them here and hand the transitions' events to [`tell`].

use crate::notify::{Event, Notifier, NotifyState, Tidings};
use crate::team::mirror::{Mirror, WriteBounds};
use anyhow::{Context, Result};

use super::session::Session;
use super::team::TeamLink;

pub(crate) fn connect_mirror(url: &str, session: &Session) -> Result<Mirror, crate::team::TeamError> {
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    let bounds = session.cluster.team.as_ref().map(WriteBounds::of).unwrap_or_default();
    Mirror::connect(url, &username, session.ledger.location(), bounds)
}

/// The mirror a profile's `team: {mirror: true}` turns on when no `--mirror` was given: a
/// connection failure is a warning (the fold-in, not the mirror, is what fails closed), retried
/// on the next iteration.
pub(crate) fn default_mirror(session: &Session, team: Option<&TeamLink>) -> Option<Mirror> {
    let team = team.filter(|t| t.settings.mirror)?;
    match connect_mirror(&team.url, session) {
        Ok(mirror) => Some(mirror),
        Err(err) => {
            tracing::warn!("mirror: not publishing this iteration: {err}");
            None
        }
    }
}

/// The profile's team database unless `offline` (`--offline-ledger`).
pub(crate) fn team_link(session: &Session, offline: bool) -> Result<Option<TeamLink>> {
    if offline { Ok(None) } else { TeamLink::of(session) }
}

/// The profile's notifier (none for a dry run, which sends nothing); a webhook secret the secrets
/// file lacks is an error here, before anything is submitted.
pub(crate) fn open_notifier(session: &Session, dry_run: bool) -> Result<Option<Notifier>> {
    let Some(settings) = session.cluster.notify.as_ref().filter(|_| !dry_run) else { return Ok(None) };
    let secrets_file = session.context().secrets_file()?;
    let notifier = Notifier::new(settings, &secrets_file);
    Ok(Some(notifier.with_context(|| format!("clusters/{}.yaml notify", session.cluster.name))?))
}

/// What is told, which decides what is not told again.
pub(crate) enum Told {
    /// A command's events (`sync`, `cancel`, `remediate`): each told as it comes.
    Events(Vec<Event>),
    /// An iteration's events: held pairs once while they stay held.
    Iteration(Tidings),
    /// An iteration that failed: told once per run of failing iterations.
    Failure(Event),
    /// A one-off (the listener stopped).
    Once(Event),
}

/// Tells people (bounded by the notifier's timeout, never failing the caller). Every delivery is
/// counted in `<state_dir>/notify.json`; problems go to the log.
pub(crate) fn tell(session: &Session, notifier: Option<&Notifier>, told: Told) {
    let Some(notifier) = notifier else { return };
    let mut state = NotifyState::load(&session.state_dir);
    let events = match told {
        Told::Iteration(tidings) => {
            state.failing = false;
            state.new_events(tidings)
        }
        Told::Failure(_) if std::mem::replace(&mut state.failing, true) => Vec::new(),
        Told::Failure(event) | Told::Once(event) => vec![event],
        Told::Events(events) => events,
    };
    if !events.is_empty() {
        let problems = notifier.send(&session.cluster.name, &events);
        for problem in &problems {
            tracing::warn!("notify: {problem}");
        }
        state.record(&problems);
    }
    if let Err(err) = state.save(&session.state_dir) {
        tracing::warn!("notify: {}: {err}", NotifyState::path(&session.state_dir).display());
    }
}
