//! `GET /runbooks` and `GET /runbooks/{alert}`: the runbook for each alert
//! in `deploy/prometheus/sluice-rules.yml`, served by the node itself.
//!
//! Every alert's `runbook_url` is `http://{{ $labels.instance }}/runbooks/
//! <alert>` — the node Prometheus scraped, on the port it scraped — so the
//! link works wherever Prometheus reaches the fleet, with no docs site to
//! host. The text is the book's runbook chapter (`docs/src/runbooks.md`),
//! built into the binary: one source, and the runbook a node serves is the
//! one for its own version.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

/// The book's runbook chapter.
const CHAPTER: &str = include_str!("../../docs/src/runbooks.md");

/// Each alert's section (`## <alert>` to the next `## `): its name and text.
fn sections() -> impl Iterator<Item = (&'static str, &'static str)> {
    let mut starts: Vec<usize> = CHAPTER.match_indices("\n## ").map(|(i, _)| i + 1).collect();
    starts.push(CHAPTER.len());
    let spans: Vec<(usize, usize)> = starts.windows(2).map(|w| (w[0], w[1])).collect();
    spans.into_iter().filter_map(|(from, to)| {
        let text = CHAPTER[from..to].trim_end();
        let name = text.lines().next()?.strip_prefix("## ")?.trim();
        Some((name, text))
    })
}

/// The runbook for `alert` (its section of the chapter), if there is one.
pub fn runbook(alert: &str) -> Option<&'static str> {
    sections().find(|(name, _)| *name == alert).map(|(_, t)| t)
}

/// The alerts that have a runbook, in the chapter's order.
pub fn alerts() -> Vec<&'static str> {
    sections().map(|(name, _)| name).collect()
}

const TEXT: &str = "text/plain; charset=utf-8";

pub(super) async fn index() -> impl IntoResponse {
    let mut body = String::from("Runbooks, one per alert: GET /runbooks/<alert>\n\n");
    for name in alerts() {
        body.push_str(name);
        body.push('\n');
    }
    ([(header::CONTENT_TYPE, TEXT)], body)
}

pub(super) async fn one(Path(alert): Path<String>) -> impl IntoResponse {
    match runbook(&alert) {
        Some(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, TEXT)],
            format!("{text}\n"),
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, TEXT)],
            format!("no runbook for alert {alert:?}: GET /runbooks lists them\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alert the rules define has a runbook, and every runbook an
    /// alert: the rules file is read as text (one `- alert: <name>` line
    /// each), so a new alert without a runbook fails here.
    #[test]
    fn every_alert_has_a_runbook_and_every_runbook_an_alert() {
        let rules = include_str!("../../deploy/prometheus/sluice-rules.yml");
        let mut defined: Vec<&str> = rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- alert:"))
            .map(str::trim)
            .collect();
        let mut written = alerts();
        assert!(defined.len() >= 15, "the rules' alerts: {defined:?}");
        defined.sort_unstable();
        written.sort_unstable();
        assert_eq!(defined, written);
        for name in &defined {
            let text = runbook(name).unwrap();
            for part in ["**Means.**", "**Check.**", "**Do.**"] {
                assert!(text.contains(part), "{name}'s runbook lacks {part}");
            }
            // Its link, as the rules give it.
            let url = format!("runbook_url: \"http://{{{{ $labels.instance }}}}/runbooks/{name}\"");
            assert!(rules.contains(&url), "{name} lacks {url}");
        }
        assert_eq!(runbook("SluiceNoSuchAlert"), None);
    }
}
