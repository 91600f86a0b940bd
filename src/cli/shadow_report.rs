//! `toolgate shadow-report AUDIT_FILE [--json]`: what the shadow candidate would have decided
//! differently, summarised from the `shadow_decision` events of an audit file, e.g. "12 calls of
//! delete_ticket that were OK would be DENIED by access [denied_by_policy], rule
//! tenants.globex.deny[1]". Other events are skipped; so are lines that are not JSON (counted).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::Path,
};

use serde::Serialize;
use serde_json::Value;

use super::{Failure, print_json};

/// One line of the summary: what the served catalog did and what the candidate would do. In
/// `--json`, the variant is the object's `kind`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind")]
enum Group {
    #[serde(rename = "decision")]
    Decision {
        tool: String,
        was: String,
        status: String,
        refused_by: String,
        error_type: String,
        rule: String,
        #[serde(rename = "rule_pattern")]
        pattern: String,
    },
    #[serde(rename = "tool_version")]
    Version {
        tool: String,
        was: String,
        would: String,
    },
    #[serde(rename = "bound_arguments")]
    Bound {
        tool: String,
        /// The candidate's bound paths, as the event lists them.
        paths: Vec<String>,
    },
}

impl Group {
    fn text(&self, count: u64) -> String {
        let (calls, were) = if count == 1 {
            ("call", "was")
        } else {
            ("calls", "were")
        };
        match self {
            Group::Decision {
                tool,
                was,
                status,
                refused_by,
                error_type,
                rule,
                pattern,
            } => {
                let would = match (status.as_str(), refused_by.as_str()) {
                    ("OK", _) => "would be OK (the backend would be called)".to_owned(),
                    (_, "") => format!("would be {status}"),
                    _ => format!("would be {status} by {refused_by} [{error_type}]"),
                };
                let rule = match (rule.as_str(), pattern.as_str()) {
                    ("", _) => String::new(),
                    (rule, "") => format!(", rule {rule}"),
                    (rule, pattern) => format!(", rule {rule} ({pattern:?})"),
                };
                format!("{count} {calls} of {tool} that {were} {was} {would}{rule}")
            }
            Group::Version { tool, was, would } => format!(
                "{count} {calls} of {tool} would resolve to version {would} instead of {was}"
            ),
            Group::Bound { tool, paths } => {
                let paths = match paths.is_empty() {
                    true => String::new(),
                    false => format!(" ({})", paths.join(", ")),
                };
                format!("{count} {calls} of {tool} would send other bound arguments{paths}")
            }
        }
    }
}

/// `shadow-report --json`: one object, the counts and the differences most frequent first.
#[derive(Serialize)]
struct ReportJson<'a> {
    events: u64,
    unreadable_lines: u64,
    /// Candidate revision -> how many events it decided.
    candidate_revisions: &'a BTreeMap<String, u64>,
    differences: Vec<DifferenceJson<'a>>,
}

/// One group of differences and how many events it counts.
#[derive(Serialize)]
struct DifferenceJson<'a> {
    count: u64,
    #[serde(flatten)]
    group: &'a Group,
}

/// Reads the file and prints the summary, most frequent first.
pub fn run(audit: &Path, json_output: bool) -> Result<(), Failure> {
    let file = std::fs::File::open(audit)
        .map_err(|err| Failure::error(format_args!("cannot read {}: {err}", audit.display())))?;
    let mut groups: BTreeMap<Group, u64> = BTreeMap::new();
    let (mut events, mut unreadable) = (0u64, 0u64);
    let mut revisions: BTreeMap<String, u64> = BTreeMap::new();
    for line in BufReader::new(file).lines() {
        let Ok(line) = line else {
            unreadable += 1;
            continue;
        };
        // Cheap filter first: most lines are tool calls.
        if !line.contains("\"shadow_decision\"") {
            continue;
        }
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            unreadable += 1;
            continue;
        };
        if event.get("kind").and_then(Value::as_str) != Some("shadow_decision") {
            continue;
        }
        events += 1;
        let candidate = event.get("candidate").cloned().unwrap_or(Value::Null);
        let revision = text(&candidate, "revision");
        *revisions.entry(revision).or_default() += 1;
        for group in groups_of(&event, &candidate) {
            *groups.entry(group).or_default() += 1;
        }
    }
    let mut ranked: Vec<(&Group, u64)> = groups.iter().map(|(g, n)| (g, *n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    if json_output {
        print_json(&ReportJson {
            events,
            unreadable_lines: unreadable,
            candidate_revisions: &revisions,
            differences: ranked
                .iter()
                .map(|(group, count)| DifferenceJson {
                    count: *count,
                    group,
                })
                .collect(),
        })?;
        return Ok(());
    }
    let revisions: Vec<String> = revisions
        .iter()
        .map(|(revision, n)| format!("{revision} ({n})"))
        .collect();
    println!(
        "{}: {events} shadow_decision events; candidate revisions: {}",
        audit.display(),
        if revisions.is_empty() {
            "none".to_owned()
        } else {
            revisions.join(", ")
        }
    );
    for (group, count) in &ranked {
        println!("  {}", group.text(*count));
    }
    if unreadable > 0 {
        println!("  ({unreadable} lines were not JSON and were skipped)");
    }
    Ok(())
}

fn text(value: &Value, key: &str) -> String {
    value
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The summary lines one event counts towards: its decision, version and bound arguments
/// differences.
fn groups_of(event: &Value, candidate: &Value) -> Vec<Group> {
    let differences: Vec<&str> = event
        .get("differences")
        .and_then(Value::as_array)
        .map(|d| d.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let tool = text(event, "tool");
    let mut groups = Vec::new();
    if differences.contains(&"status") || differences.contains(&"refused_by") {
        let status = text(event, "status");
        let reached = event.get("reached_backend").and_then(Value::as_bool) == Some(true);
        let was = match (reached, status.as_str()) {
            (true, "OK") | (false, _) => match text(event, "refused_by").as_str() {
                "" => status.clone(),
                stage => format!("{status} by {stage}"),
            },
            (true, _) => format!("run ({status} at the backend)"),
        };
        groups.push(Group::Decision {
            tool: tool.clone(),
            was,
            status: text(candidate, "status"),
            refused_by: text(candidate, "refused_by"),
            error_type: text(candidate, "error_type"),
            rule: text(candidate, "rule"),
            pattern: text(candidate, "rule_pattern"),
        });
    }
    if differences.contains(&"tool_version") {
        groups.push(Group::Version {
            tool: tool.clone(),
            was: text(event, "tool_version"),
            would: text(candidate, "tool_version"),
        });
    }
    if differences.contains(&"bound_arguments") {
        let paths = candidate
            .get("bound_arguments")
            .and_then(Value::as_array)
            .map(|p| {
                p.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        groups.push(Group::Bound { tool, paths });
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    // What `--json` prints, byte for byte (count first, then kind). (Pinned from the
    // hand-built json! objects these types replaced.)
    #[test]
    fn the_json_report_gives_each_group_with_its_count_and_kind() {
        let groups = [
            Group::Decision {
                tool: "create_ticket".into(),
                was: "OK".into(),
                status: "DENIED".into(),
                refused_by: "access".into(),
                error_type: "denied_by_policy".into(),
                rule: "tenants.globex.deny[1]".into(),
                pattern: "create_*\"".into(),
            },
            Group::Version {
                tool: "lookup".into(),
                was: "1".into(),
                would: "2".into(),
            },
            Group::Bound {
                tool: "search".into(),
                paths: vec!["filter.owner".into(), "é".into()],
            },
            Group::Bound {
                tool: "s".into(),
                paths: vec![],
            },
        ];
        let revisions = BTreeMap::from([("r1".to_owned(), 3), ("a0".to_owned(), 1)]);
        let report = ReportJson {
            events: 7,
            unreadable_lines: 2,
            candidate_revisions: &revisions,
            differences: groups
                .iter()
                .zip([5, 1, 1, 0])
                .map(|(group, count)| DifferenceJson { count, group })
                .collect(),
        };
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            concat!(
                r#"{"events":7,"unreadable_lines":2,"candidate_revisions":{"a0":1,"r1":3},"#,
                r#""differences":[{"count":5,"kind":"decision","tool":"create_ticket","was":"OK","#,
                r#""status":"DENIED","refused_by":"access","error_type":"denied_by_policy","#,
                r#""rule":"tenants.globex.deny[1]","rule_pattern":"create_*\""},{"count":1,"#,
                r#""kind":"tool_version","tool":"lookup","was":"1","would":"2"},{"count":1,"#,
                r#""kind":"bound_arguments","tool":"search","paths":["filter.owner","é"]},"#,
                r#"{"count":0,"kind":"bound_arguments","tool":"s","paths":[]}]}"#,
            )
        );
    }
}
