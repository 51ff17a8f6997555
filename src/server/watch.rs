//! Reload what an operator edits, without a restart: the config file's
//! policies and the Envoy rules. A broken edit is refused with a message
//! naming the key (or file and line) and the previous version keeps serving.
//!
//! Editors replace files (write a temporary, rename it over) and Kubernetes
//! swaps a ConfigMap's `..data` symlink, so both watchers watch a directory,
//! not a file, and settle a burst of events into one reload. Only events
//! about the files that are loaded count (a log written next to them is
//! not a reason to reload), and the rules reload only when their content
//! changed.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::StartError;
use crate::algorithm::Bounds;
use crate::cluster::membership::Membership;
use crate::config::{Config, EnvoyConfig, Sources};
use crate::limiter::Limiter;
use crate::policy::Policies;
use crate::policy::rules::{self, Rules, RulesError};

/// Whether `event` may have changed what a path `relevant` accepts names:
/// an access (an open, a read, a close after reading) changes nothing; a
/// close after writing does (a writer's last word). So does a rescan: the
/// kernel's queue overflowed, and any event lost may have been a change.
///
/// Reloading reads the files, and inotify reports opens: counted, every
/// reload caused the next — ten a second, and where nodes share a rules
/// directory (sidecars on one host path, `benches/fleet_stress.py`) each
/// node's reload woke every other's, 40 nodes spending most of two cores
/// on it.
fn may_change(event: &notify::Event, relevant: impl Fn(&Path) -> bool) -> bool {
    use notify::event::{AccessKind, AccessMode};
    let read_only = match event.kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        notify::EventKind::Access(_) => true,
        _ => false,
    };
    event.need_rescan() || (!read_only && event.paths.iter().any(|p| relevant(p)))
}

/// Watch `dirs` (the node does not start without them) and, where it
/// can, `helpful` (a warning if not); only events that may change a path
/// `relevant` accepts count.
fn watch_dirs(
    dirs: &[&Path],
    helpful: &[&Path],
    relevant: impl Fn(&Path) -> bool + Send + 'static,
) -> Result<(notify::RecommendedWatcher, mpsc::Receiver<()>), StartError> {
    let (tx, rx) = mpsc::channel::<()>(16);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if may_change(&event, &relevant) {
            // A full channel already holds a pending reload.
            let _ = tx.try_send(());
        }
    })?;
    for dir in dirs {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
    }
    for dir in helpful {
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            tracing::warn!(
                path = %dir.display(),
                error = %e,
                "cannot watch the rules directory's parent: a swap of a symlinked rules \
                 directory (a ConfigMap's ..data) may go unnoticed after the first"
            );
        }
    }
    Ok((watcher, rx))
}

/// Run `reload` after each settled burst of events until cancelled. First,
/// if `rewatch` now leads elsewhere, it is watched where it leads: a
/// directory reached through a symlink is watched where the symlink led
/// when the watch began, and a swap leaves that watch on a directory
/// nobody reads (the kubelet deletes it). Watched before the files are
/// read, so an edit just after the read is seen; and added to, never
/// removed and added again (events queued meanwhile would be dropped).
async fn reload_on_change<F, Fut>(
    mut watcher: notify::RecommendedWatcher,
    mut rx: mpsc::Receiver<()>,
    rewatch: Option<PathBuf>,
    token: CancellationToken,
    mut reload: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut target = rewatch.as_ref().and_then(|d| std::fs::canonicalize(d).ok());
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            Some(()) = rx.recv() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                while rx.try_recv().is_ok() {}
                if let Some(dir) = &rewatch {
                    let now = std::fs::canonicalize(dir).ok();
                    if now.is_some() && now != target {
                        match watcher.watch(dir, RecursiveMode::NonRecursive) {
                            Ok(()) => target = now,
                            Err(e) => tracing::warn!(
                                path = %dir.display(),
                                error = %e,
                                "cannot watch the rules directory where it now leads; \
                                 edits inside it reload only with a swap in its parent"
                            ),
                        }
                    }
                }
                reload().await;
            }
        }
    }
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reload policies when the config file changes.
pub fn config(
    path: PathBuf,
    sources: Sources,
    running: Config,
    limiter: Limiter,
    membership: Membership,
    token: CancellationToken,
) -> Result<impl Future<Output = ()>, StartError> {
    let name: Option<OsString> = path.file_name().map(|n| n.to_os_string());
    let (watcher, rx) = watch_dirs(&[&parent(&path)], &[], move |p| {
        // A ConfigMap's file is a symlink through `..data`, which the
        // kubelet swaps in one rename: the file itself never changes.
        let swap = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("..data"));
        swap || name.as_deref().is_none_or(|n| p.file_name() == Some(n))
    })?;
    Ok(reload_on_change(watcher, rx, None, token, move || {
        let (sources, running, limiter, membership) = (
            sources.clone(),
            running.clone(),
            limiter.clone(),
            membership.clone(),
        );
        async move {
            if let Some(policies) = reload_config(&sources, &running, &limiter) {
                apply_policies(&limiter, &membership, policies).await;
            }
        }
    }))
}

/// Reloaded policies take over: the limiter decides by them from now, and
/// the policy hash this node gossips follows. (The simulator's config
/// reloads come through here too.)
pub async fn apply_policies(limiter: &Limiter, membership: &Membership, policies: Policies) {
    let hash = policies.hash();
    limiter.set_policies(policies);
    membership.set_policy_hash(&hash).await;
}

/// Reload; the new policies on success.
fn reload_config(sources: &Sources, running: &Config, limiter: &Limiter) -> Option<Policies> {
    match crate::policy::load(sources) {
        Ok((config, policies)) => {
            let count = policies.len();
            limiter.metrics().reloaded(true);
            let mut rest = config.clone();
            rest.policies = running.policies.clone();
            if rest != *running {
                tracing::warn!("config reloaded: policies applied; other changes need a restart");
            }
            tracing::info!(policies = count, "config reloaded");
            Some(policies)
        }
        Err(e) => {
            limiter.metrics().reloaded(false);
            tracing::error!(error = %e, "config reload refused; the previous config keeps serving");
            None
        }
    }
}

/// Load the Envoy rules at `path` (a file or a directory) into the limiter.
pub fn load_rules(
    path: &Path,
    envoy: &EnvoyConfig,
    bounds: &Bounds,
    limiter: &Limiter,
) -> Result<(), RulesError> {
    let files = rules::read_files(path)?;
    apply_rules(path, &files, envoy, bounds, limiter)
}

fn apply_rules(
    path: &Path,
    files: &[(PathBuf, String)],
    envoy: &EnvoyConfig,
    bounds: &Bounds,
    limiter: &Limiter,
) -> Result<(), RulesError> {
    let rules = Rules::from_files(files, bounds, envoy.merge_domain_config)?;
    if rules.has_metadata() && !envoy.response_dynamic_metadata {
        tracing::warn!(
            path = %path.display(),
            "envoy rules: `metadata` is accepted but not sent anywhere; \
             set envoy.response_dynamic_metadata = true to send it to Envoy"
        );
    }
    tracing::info!(domains = rules.domains(), path = %path.display(), "envoy rules loaded");
    limiter.set_rules(rules);
    Ok(())
}

/// Reload the Envoy rules when a rule file in their directory changes (a
/// ConfigMap's symlink swap included) and its content is new. A rewrite
/// with the same content is counted as `result="unchanged"` in
/// `sluice_config_reloads_total` and reloads nothing.
pub fn rules(
    path: PathBuf,
    envoy: EnvoyConfig,
    bounds: Bounds,
    limiter: Limiter,
    token: CancellationToken,
) -> Result<impl Future<Output = ()>, StartError> {
    // Events name paths as notify makes them: absolute.
    let path = std::path::absolute(&path).unwrap_or(path);
    // A directory is watched, and its parent too where it can be: where
    // the directory is a symlink into a ConfigMap (`rules -> ..data/rules`,
    // the DaemonSet's layout) its own watch follows the directory it led to
    // at start, which the first swap deletes; the parent sees every swap
    // of `..data` (and of the symlink itself).
    let is_dir = path.is_dir();
    let up = parent(&path);
    let (dir, helpful): (&Path, Vec<&Path>) = if is_dir {
        (&path, vec![&up])
    } else {
        (&up, vec![])
    };
    let own_name = path.file_name().map(|n| n.to_os_string());
    let inside = is_dir.then(|| path.clone());
    let rewatch = inside.clone();
    let (watcher, rx) = watch_dirs(&[dir], &helpful, move |p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // The kubelet swaps a ConfigMap in one rename of `..data_tmp` to
        // `..data`; the files themselves are symlinks that never change.
        if name.starts_with("..data") {
            return true;
        }
        match &inside {
            // In the rules directory: its rule files.
            Some(dir) if p.parent() == Some(dir.as_path()) => rules::is_rule_file(p),
            // Beside it (its parent): its own name only — the rules file,
            // or the directory's symlink swapped.
            _ => p.file_name() == own_name.as_deref(),
        }
    })?;
    // What was last loaded (or last refused): the same content again is
    // not a change.
    let mut last = Some(limiter.rules().fingerprint());
    Ok(reload_on_change(watcher, rx, rewatch, token, move || {
        let files = match rules::read_files(&path) {
            Ok(files) => files,
            Err(e) => {
                limiter.metrics().reloaded(false);
                tracing::error!(error = %e, "envoy rules reload refused; the previous rules keep serving");
                return std::future::ready(());
            }
        };
        let seen = rules::fingerprint(&files);
        if last == Some(seen) {
            limiter
                .metrics()
                .reloads
                .get_or_create(&vec![("result", "unchanged")])
                .inc();
            tracing::debug!(path = %path.display(), "envoy rules unchanged; not reloaded");
            return std::future::ready(());
        }
        last = Some(seen);
        match apply_rules(&path, &files, &envoy, &bounds, &limiter) {
            Ok(()) => limiter.metrics().reloaded(true),
            Err(e) => {
                limiter.metrics().reloaded(false);
                tracing::error!(error = %e, "envoy rules reload refused; the previous rules keep serving");
            }
        }
        std::future::ready(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, EventKind, ModifyKind, RemoveKind,
        RenameMode,
    };

    fn event(kind: EventKind, path: &str) -> notify::Event {
        notify::Event::new(kind).add_path(PathBuf::from(path))
    }

    fn rules_yaml(p: &Path) -> bool {
        p.file_name().is_some_and(|n| n == "rules.yaml")
    }

    #[test]
    fn reading_a_file_is_no_change() {
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ] {
            assert!(
                !may_change(&event(kind, "/r/rules.yaml"), rules_yaml),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_rescan_is_a_change() {
        let lost = notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        assert!(may_change(&lost, rules_yaml));
        assert!(!may_change(
            &notify::Event::new(EventKind::Other),
            rules_yaml
        ));
    }

    #[test]
    fn writing_creating_renaming_or_removing_a_relevant_file_is() {
        for kind in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Create(CreateKind::File),
            EventKind::Remove(RemoveKind::File),
        ] {
            assert!(
                may_change(&event(kind, "/r/rules.yaml"), rules_yaml),
                "{kind:?}"
            );
            assert!(
                !may_change(&event(kind, "/r/other.log"), rules_yaml),
                "{kind:?}"
            );
        }
    }
}
