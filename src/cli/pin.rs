//! `toolgate pin`: connect to a catalog's MCP servers, as the sidecar would, and print the pin of
//! each tool the catalog lists (`catalog::pins`), or with `--write` set them in the file. The
//! file is edited in place, comments and layout kept, and only written when the edited text
//! means exactly the old one with the new pins.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_yaml_ng::Value as Yaml;

use super::Failure;
use crate::{
    catalog::{Discovered, pins},
    config::Config,
    executor::mcp::McpManager,
    settings::Env,
};

/// A server that lists nothing within its start-up timeout, plus this, is reported as down.
const MARGIN: Duration = Duration::from_secs(1);

/// One tool's pin, as listed now, and as the catalog has it.
struct Found {
    server: String,
    tool: String,
    pin: Option<String>,
    configured: Option<String>,
}

pub(super) async fn run(path: PathBuf, write: bool) -> Result<(), Failure> {
    let config = Config::load_file(&path, &Env::from_process()).map_err(Failure::error)?;
    let servers = &config.mcp_servers;
    if servers.is_empty() {
        return Err(Failure::error(format_args!(
            "{}: no mcp_servers to pin",
            config.source
        )));
    }
    let discovered = discover(&config).await;
    let mut found = Vec::new();
    for server in servers {
        let raw = config.catalog_inputs.raw.mcp_servers.get(&server.name);
        let listed = discovered.get(&server.name);
        for tool in &server.tools {
            let pin = listed
                .and_then(|tools| tools.iter().find(|t| &t.name == tool))
                .map(pins::pin_of);
            let configured = raw
                .and_then(|r| r.tools.get(tool))
                .and_then(|t| t.pin.clone());
            found.push(Found {
                server: server.name.clone(),
                tool: tool.clone(),
                pin,
                configured,
            });
        }
    }
    print!("{}", fragment(&found, &discovered));
    let missing: Vec<String> = found
        .iter()
        .filter(|f| f.pin.is_none())
        .map(|f| {
            let why = if discovered.contains_key(&f.server) {
                "the server does not offer it"
            } else {
                "the server did not come up and list its tools in time"
            };
            format!("mcp_servers.{}.tools.{}: no pin: {why}", f.server, f.tool)
        })
        .collect();
    if !missing.is_empty() {
        let mut errors = missing;
        if write {
            errors.push(format!("{} not written", config.source));
        }
        return Err(Failure::Errors(errors));
    }
    if write {
        let pinned: Vec<(String, String, String)> = found
            .iter()
            .filter_map(|f| Some((f.server.clone(), f.tool.clone(), f.pin.clone()?)))
            .collect();
        let changed = found.iter().filter(|f| f.pin != f.configured).count();
        write_pins(&path, &pinned).map_err(|err| Failure::error(format_args!("{err}")))?;
        eprintln!(
            "{}: {} pins written ({changed} new or changed)",
            config.source,
            pinned.len()
        );
    }
    Ok(())
}

/// Starts the catalog's MCP servers and waits until each listed its tools, or its start-up
/// timeout passed.
async fn discover(config: &Config) -> Discovered {
    let servers = &config.mcp_servers;
    let manager = McpManager::start(servers, &crate::clock::SharedClock::system());
    let mut discovered = manager.watch_discovered();
    let wait = servers
        .iter()
        .map(|s| s.startup_timeout)
        .max()
        .unwrap_or_default()
        + MARGIN;
    let all_listed = |d: &Discovered| servers.iter().all(|s| d.contains_key(&s.name));
    let _ = tokio::time::timeout(wait, discovered.wait_for(all_listed)).await;
    let listed = discovered.borrow().clone();
    if !manager.stopped(Duration::from_secs(5)).await {
        tracing::warn!("an MCP server did not stop within 5s");
    }
    listed
}

/// The pins as a fragment of the catalog, to paste or compare.
fn fragment(found: &[Found], discovered: &Discovered) -> String {
    let mut by_server: BTreeMap<&str, Vec<&Found>> = BTreeMap::new();
    for f in found {
        by_server.entry(&f.server).or_default().push(f);
    }
    let mut out = String::from("mcp_servers:\n");
    for (server, tools) in by_server {
        out.push_str(&format!("  {server}:\n    tools:\n"));
        for f in tools {
            out.push_str(&format!("      {}:\n", f.tool));
            let note = match (&f.pin, &f.configured) {
                (None, _) if discovered.contains_key(server) => {
                    "# not offered by the server".to_owned()
                }
                (None, _) => "# the server did not list its tools".to_owned(),
                (Some(pin), Some(configured)) if pin == configured => {
                    "# as the catalog pins it".to_owned()
                }
                (Some(_), Some(configured)) => {
                    format!("# the catalog pins {configured}: the definition changed")
                }
                (Some(_), None) => "# not pinned in the catalog yet".to_owned(),
            };
            match &f.pin {
                Some(pin) => out.push_str(&format!("        pin: \"{pin}\"  {note}\n")),
                None => out.push_str(&format!("        {note}\n")),
            }
        }
    }
    out
}

/// Sets the pins in the file: edited as text, checked to mean the old file with the new pins,
/// written whole (a temporary file renamed over it).
fn write_pins(path: &Path, pinned: &[(String, String, String)]) -> Result<(), String> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|err| format!("cannot read {shown}: {err}"))?;
    let edited = set_pins(&text, pinned).map_err(|err| {
        format!("{shown}: {err}; nothing written (set the pins printed above by hand)")
    })?;
    // A ConfigMap mounts the file through symlinks: replace what they point at.
    let target = std::fs::canonicalize(path).map_err(|err| format!("{shown}: {err}"))?;
    let mut temporary = target.clone().into_os_string();
    temporary.push(".toolgate-pin");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, edited)
        .and_then(|()| {
            let permissions = std::fs::metadata(&target)?.permissions();
            std::fs::set_permissions(&temporary, permissions)?;
            std::fs::rename(&temporary, &target)
        })
        .map_err(|err| {
            let _ = std::fs::remove_file(&temporary);
            format!("cannot write {shown}: {err}")
        })
}

/// `text` with each `(server, tool, pin)` set at `mcp_servers.<server>.tools.<tool>.pin`.
fn set_pins(text: &str, pinned: &[(String, String, String)]) -> Result<String, String> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for (server, tool, pin) in pinned {
        set_pin(&mut lines, server, tool, pin).map_err(|why| {
            format!("cannot place the pin of mcp_servers.{server}.tools.{tool}: {why}")
        })?;
    }
    let mut edited = lines.join("\n");
    if text.ends_with('\n') {
        edited.push('\n');
    }
    // The edit must mean the old text with the new pins, and nothing else.
    let mut expected: Yaml = serde_yaml_ng::from_str(text).map_err(|err| err.to_string())?;
    for (server, tool, pin) in pinned {
        let settings = expected
            .get_mut("mcp_servers")
            .and_then(|s| s.get_mut(server.as_str()))
            .and_then(|s| s.get_mut("tools"))
            .and_then(|t| t.get_mut(tool.as_str()))
            .and_then(Yaml::as_mapping_mut)
            .ok_or_else(|| format!("mcp_servers.{server}.tools.{tool} is not a mapping"))?;
        settings.insert(Yaml::from("pin"), Yaml::from(pin.as_str()));
    }
    let placed = || {
        pinned
            .iter()
            .map(|(server, tool, _)| format!("mcp_servers.{server}.tools.{tool}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let read: Yaml = serde_yaml_ng::from_str(&edited).map_err(|err| {
        format!(
            "cannot place the pins of {}: the edited text would not parse ({err})",
            placed()
        )
    })?;
    if read != expected {
        return Err(format!(
            "cannot place the pins of {}: the file's layout is one this editor cannot follow",
            placed()
        ));
    }
    Ok(edited)
}

/// Indentation of a line, or `None` for a blank or comment-only line.
fn indent(line: &str) -> Option<usize> {
    let trimmed = line.trim_start();
    (!trimmed.is_empty() && !trimmed.starts_with('#')).then(|| line.len() - trimmed.len())
}

/// The text after `key:` on a line of the given indentation, if the line is that key.
fn after_key<'a>(line: &'a str, at: usize, key: &str) -> Option<&'a str> {
    if indent(line) != Some(at) {
        return None;
    }
    let rest = &line[at..];
    [key.to_owned(), format!("\"{key}\""), format!("'{key}'")]
        .iter()
        .find_map(|spelling| rest.strip_prefix(spelling.as_str()))
        .and_then(|rest| rest.strip_prefix(':'))
        .filter(|rest| rest.is_empty() || rest.starts_with(' '))
}

/// The line of `key` among the children (at one indentation) of the block from `start` (a line
/// index, exclusive) that ends at the first line indented `parent` or less; and the children's
/// indentation.
fn find_child(
    lines: &[String],
    start: usize,
    parent: Option<usize>,
    key: &str,
) -> Result<(usize, usize), String> {
    let end = block_end(lines, start, parent);
    let at = (start + 1..end)
        .find_map(|i| indent(&lines[i]))
        .ok_or_else(|| format!("no {key:?} found"))?;
    (start + 1..end)
        .find(|&i| after_key(&lines[i], at, key).is_some())
        .map(|i| (i, at))
        .ok_or_else(|| format!("no {key:?} key written in block style"))
}

/// The first line after `start` indented `parent` or less (the end of its block).
fn block_end(lines: &[String], start: usize, parent: Option<usize>) -> usize {
    (start + 1..lines.len())
        .find(|&i| match (indent(&lines[i]), parent) {
            (Some(n), Some(p)) => n <= p,
            (Some(n), None) => n == 0,
            (None, _) => false,
        })
        .unwrap_or(lines.len())
}

/// Whether what follows a key opens a block (nothing but perhaps a comment).
fn opens_block(rest: &str) -> bool {
    let rest = rest.trim();
    rest.is_empty() || rest.starts_with('#')
}

fn set_pin(lines: &mut Vec<String>, server: &str, tool: &str, pin: &str) -> Result<(), String> {
    let top = lines
        .iter()
        .position(|l| after_key(l, 0, "mcp_servers").is_some_and(opens_block))
        .ok_or("no block-style mcp_servers section")?;
    let (server_line, server_at) = find_child(lines, top, Some(0), server)?;
    let (tools_line, tools_at) = find_child(lines, server_line, Some(server_at), "tools")?;
    if !after_key(&lines[tools_line], tools_at, "tools").is_some_and(opens_block) {
        return Err("tools is not written in block style".to_owned());
    }
    let (tool_line, tool_at) = find_child(lines, tools_line, Some(tools_at), tool)?;
    let rest = after_key(&lines[tool_line], tool_at, tool).unwrap_or_default();
    let value = format!("\"{pin}\"");
    if opens_block(rest) {
        let end = block_end(lines, tool_line, Some(tool_at));
        let child_at = (tool_line + 1..end)
            .find_map(|i| indent(&lines[i]))
            .ok_or("the tool has no settings")?;
        match (tool_line + 1..end).find(|&i| after_key(&lines[i], child_at, "pin").is_some()) {
            Some(i) => lines[i] = format!("{}pin: {value}", " ".repeat(child_at)),
            None => lines.insert(
                tool_line + 1,
                format!("{}pin: {value}", " ".repeat(child_at)),
            ),
        }
        return Ok(());
    }
    // One line of flow style: `tool: { risk_level: read_only }`.
    let flow = rest.trim_start();
    let Some(inner) = flow.strip_prefix('{') else {
        return Err("the tool's settings are neither a block nor a one-line { … }".to_owned());
    };
    let head = &lines[tool_line][..lines[tool_line].len() - rest.len()];
    let existing =
        regex::Regex::new(r#"pin:\s*("[^"]*"|'[^']*'|[^,}\s]+)"#).map_err(|err| err.to_string())?;
    let replaced = if existing.is_match(inner) {
        existing
            .replace(inner, format!("pin: {value}").as_str())
            .into_owned()
    } else if inner.trim_start().starts_with('}') {
        format!(" pin: {value} {}", inner.trim_start())
    } else {
        format!(" pin: {value},{inner}")
    };
    lines[tool_line] = format!("{head} {{{replaced}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn pins(list: &[(&str, &str)]) -> Vec<(String, String, String)> {
        list.iter()
            .map(|(s, t)| (s.to_string(), t.to_string(), PIN.to_owned()))
            .collect()
    }

    #[test]
    fn pins_go_into_block_and_flow_settings_keeping_comments() {
        let text = "# the catalog\nversion: 1\nmcp_servers:\n  docs:  # reviewed 2026-11\n    command: [\"python3\", \"server.py\"]\n    tools:\n      search:\n        risk_level: read_only   # keep\n        description: Searches.\n      fetch: { risk_level: read_only, timeout: 5s }\n      empty: {}\n  other:\n    url: http://127.0.0.1:1/mcp\n    tools:\n      search: { risk_level: read_only }\ntools: []\n";
        let edited = set_pins(
            text,
            &pins(&[
                ("docs", "search"),
                ("docs", "fetch"),
                ("docs", "empty"),
                ("other", "search"),
            ]),
        )
        .unwrap();
        assert_eq!(
            edited,
            format!(
                "# the catalog\nversion: 1\nmcp_servers:\n  docs:  # reviewed 2026-11\n    command: [\"python3\", \"server.py\"]\n    tools:\n      search:\n        pin: \"{PIN}\"\n        risk_level: read_only   # keep\n        description: Searches.\n      fetch: {{ pin: \"{PIN}\", risk_level: read_only, timeout: 5s }}\n      empty: {{ pin: \"{PIN}\" }}\n  other:\n    url: http://127.0.0.1:1/mcp\n    tools:\n      search: {{ pin: \"{PIN}\", risk_level: read_only }}\ntools: []\n"
            )
        );
        // Pinned again: the pins are replaced, not added.
        let again = set_pins(&edited, &pins(&[("docs", "search"), ("docs", "fetch")])).unwrap();
        assert_eq!(again, edited);
        let other = "sha256:00000000000000000000000000000000000000000000000000000000000000ff";
        let repinned = set_pins(
            &edited,
            &[
                ("docs".into(), "fetch".into(), other.into()),
                ("docs".into(), "search".into(), other.into()),
            ],
        )
        .unwrap();
        assert_eq!(repinned.matches(other).count(), 2, "{repinned}");
        assert_eq!(repinned.matches(PIN).count(), 2, "{repinned}");
    }

    #[test]
    fn a_layout_it_cannot_follow_is_refused_not_guessed() {
        for text in [
            "mcp_servers: { docs: { command: [x], tools: { search: { risk_level: read_only } } } }\n",
            "mcp_servers:\n  docs:\n    command: [x]\n    tools: { search: { risk_level: read_only } }\n",
            "mcp_servers:\n  docs:\n    command: [x]\n    tools:\n      search:\n        { risk_level: read_only }\n",
            "mcp_servers:\n  docs:\n    command: [x]\n    tools:\n      other: { risk_level: read_only }\n",
        ] {
            let err = set_pins(text, &pins(&[("docs", "search")])).unwrap_err();
            assert!(err.contains("mcp_servers.docs.tools.search"), "{err}");
        }
    }

    #[test]
    fn the_search_stays_inside_the_right_server() {
        // `search` under `other` must not be taken for docs' tool.
        let text = "mcp_servers:\n  other:\n    command: [x]\n    tools:\n      search: { risk_level: read_only }\n  docs:\n    command: [x]\n    tools:\n      search: { risk_level: read_only }\n";
        let edited = set_pins(text, &pins(&[("docs", "search")])).unwrap();
        assert_eq!(edited.matches(PIN).count(), 1);
        assert!(
            edited.ends_with(&format!(
                "search: {{ pin: \"{PIN}\", risk_level: read_only }}\n"
            )),
            "{edited}"
        );
    }
}
