//! Catalog loading: every load error names the file, the path inside it and what is wrong.

use std::{path::Path, process::Command};

use toolgate::{
    config::Config,
    settings::{ConfigError, Env},
};

/// A small valid catalog; each test breaks one thing.
const BASE: &str = r#"version: 1
identity: { dev_identity: true }
tenants:
  acme: {}
tools:
  - name: echo
    description: Returns text.
    risk_level: read_only
    timeout: 5s
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } } }
"#;

fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(yaml, "catalog.yaml", Path::new("."), &Env::default())
}

fn error(yaml: &str) -> ConfigError {
    load(yaml).expect_err("should be refused")
}

fn assert_error(yaml: &str, path: &str, says: &str) {
    let err = error(yaml);
    assert_eq!(err.file, "catalog.yaml");
    assert_eq!(err.path, path, "{err}");
    assert!(err.message.contains(says), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("catalog.yaml: {path}: ")),
        "{err}"
    );
}

#[test]
fn the_base_catalog_loads() {
    assert!(load(BASE).is_ok());
}

#[test]
fn an_invalid_schema_is_refused() {
    assert_error(
        &BASE.replace("{ text: { type: string } }", "{ text: { type: strng } }"),
        "tools[0].input_schema",
        "invalid JSON Schema",
    );
}

#[test]
fn a_duplicate_name_and_version_is_refused() {
    let tool = &BASE[BASE.find("  - name: echo").unwrap()..];
    assert_error(
        &format!("{BASE}{tool}"),
        "tools[1].version",
        "duplicate tool \"echo\" version \"1\"",
    );
}

#[test]
fn an_unknown_executor_is_refused() {
    assert_error(
        &BASE.replace("builtin: echo", "builtin: ech0"),
        "tools[0].executor.builtin",
        "unknown builtin tool \"ech0\"",
    );
    assert_error(
        &BASE.replace("{ builtin: echo }", "{ shell: ls }"),
        "tools[0].executor.shell",
        "unknown field `shell`",
    );
}

#[test]
fn a_pattern_matching_no_tool_is_refused() {
    assert_error(
        &BASE.replace("acme: {}", "acme: { deny: [\"ticket_*\"] }"),
        "tenants.acme.deny[0]",
        "matches no tool",
    );
    assert_error(
        &format!("{BASE}agents:\n  bot: {{ allow: [\"ech\"] }}\n"),
        "agents.bot.allow[0]",
        "matches no tool",
    );
}

#[test]
fn a_bad_duration_is_refused() {
    assert_error(
        &BASE.replace("timeout: 5s", "timeout: 5 parsecs"),
        "tools[0].timeout",
        "invalid duration",
    );
}

#[test]
fn unknown_fields_and_versions_are_refused() {
    assert_error(
        &BASE.replace(
            "risk_level: read_only",
            "risk_level: read_only\n    risk: high",
        ),
        "tools[0].risk",
        "unknown field `risk`",
    );
    assert_error(
        &BASE.replace("version: 1", "version: 2"),
        "version",
        "unsupported config version 2",
    );
    assert_error(
        &BASE.replace("read_only", "harmless"),
        "tools[0].risk_level",
        "unknown variant `harmless`",
    );
}

#[test]
fn bindings_must_name_declared_properties() {
    let yaml = BASE.replace(
        "    input_schema:",
        "    bind: { filter.tenant: \"${caller.tenant}\" }\n    input_schema:",
    );
    assert_error(&yaml, "tools[0].bind.filter.tenant", "declares no property");
}

#[test]
fn a_catalog_without_identity_is_refused() {
    assert_error(
        &BASE.replace("identity: { dev_identity: true }\n", ""),
        "identity",
        "no way to identify callers",
    );
}

#[test]
fn check_exits_zero_for_valid_and_non_zero_naming_the_error_for_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&good, BASE).unwrap();
    std::fs::write(&bad, BASE.replace("timeout: 5s", "timeout: soon")).unwrap();
    let run = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .arg("check")
            .arg("--config")
            .arg(path)
            .output()
            .unwrap()
    };
    let ok = run(&good);
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("ok (1 tools"));
    let failed = run(&bad);
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: tools[0].timeout: invalid duration",
            bad.display()
        )),
        "{stderr}"
    );
    let missing = run(&dir.path().join("nope.yaml"));
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read file"));
}

#[test]
fn the_embedded_demo_and_every_example_pass_check() {
    let demo = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check")
        .output()
        .unwrap();
    assert!(demo.status.success(), "{demo:?}");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        // `*.tests.yaml` are `toolgate test` files, not catalogs (catalog_tests.rs runs them).
        let is_tests = path.to_string_lossy().ends_with(".tests.yaml");
        if path.extension().is_some_and(|e| e == "yaml") && !is_tests {
            let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
                .arg("check")
                .arg("--config")
                .arg(&path)
                .env("BILLING_API_TOKEN", "example-token")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "demo, http, process and mcp examples: {checked}"
    );
}

#[test]
fn the_published_config_schema_is_current_and_accepts_the_demo() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.schema.json");
    let generated =
        serde_json::to_string_pretty(&toolgate::settings::json_schema()).unwrap() + "\n";
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "docs/config.schema.json is stale: run `UPDATE_SCHEMA=1 cargo test the_published_config_schema`"
    );
    // The schema really describes the format: the demo validates against it.
    let schema: serde_json::Value = serde_json::from_str(&published).unwrap();
    let demo: serde_json::Value =
        serde_yaml_ng::from_str(toolgate::settings::DEMO_CATALOG).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&demo)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn the_boundary_page_documents_every_error_type_with_its_status() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/boundary.md"))
            .unwrap();
    for reason in toolgate::error::Reason::ALL {
        let row = format!("| `{}` | `{}` |", reason.status().as_str(), reason.code());
        assert!(
            page.contains(&row),
            "docs/boundary.md lacks the row starting {row}"
        );
    }
}

/// Every default the catalog format states — `(default 30s)` in a field's description, which
/// is what `docs/config.schema.json`, editors and the docs show — is the value the loader
/// applies when the field is absent: in each example catalog, the field removed everywhere and
/// the field set to the stated value everywhere load to the same configuration. A default is
/// thus defined once (where the loader applies it) and its prose is checked against it.
#[test]
fn every_default_the_format_states_is_the_one_the_loader_applies() {
    use serde_yaml_ng::Value as Yaml;
    let schema = toolgate::settings::json_schema();
    let mut stated = Vec::new();
    collect_stated_defaults(&schema, &schema, &mut Vec::new(), &mut stated);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let read = |name: &str| std::fs::read_to_string(examples.join(name)).unwrap();
    // The examples between them have every section; this one adds JWT identity and Redis.
    let jwt_and_redis = "version: 1\nidentity:\n  dev_identity: false\n  jwt:\n    hs256_secret_env: DEFAULTS_TEST_SECRET\n    claims: {}\nstate:\n  backend: redis\n  redis: { url: \"redis://127.0.0.1:1\" }\ntenants: { acme: {} }\ntools:\n  - name: echo\n    description: Echoes.\n    risk_level: read_only\n    executor: { builtin: echo }\n    input_schema: { type: object, properties: { text: { type: string } } }\n";
    let bases = [
        ("demo", toolgate::settings::DEMO_CATALOG.to_owned()),
        ("http.yaml", read("http.yaml")),
        ("process.yaml", read("process.yaml")),
        ("mcp.yaml", read("mcp.yaml")),
        ("identity.yaml", read("identity.yaml")),
        ("handoff.yaml", read("handoff.yaml")),
        ("jwt and redis", jwt_and_redis.to_owned()),
    ];
    let env = Env::default().with("BILLING_API_TOKEN", "x").with(
        "DEFAULTS_TEST_SECRET",
        "a-secret-of-at-least-thirty-two-bytes!!",
    );
    let load = |yaml: &Yaml| -> Result<String, String> {
        let text = serde_yaml_ng::to_string(yaml).unwrap();
        let config =
            Config::from_yaml(&text, "test", &examples, &env).map_err(|err| format!("{err}"))?;
        // What the running parts are built from; not where the text came from.
        Ok(format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
            config.server,
            config.identity,
            config.limits,
            config.approvals,
            config.audit,
            config.state,
            config.telemetry,
            config.catalog,
            config.catalog_inputs.mcp_servers,
            config.upstreams,
        ))
    };
    let mut checked = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for (base, text) in &bases {
        let base_yaml: Yaml = serde_yaml_ng::from_str(text).unwrap();
        load(&base_yaml).unwrap_or_else(|err| panic!("{base}: {err}"));
        for (path, value) in &stated {
            let (mut absent, mut set) = (base_yaml.clone(), base_yaml.clone());
            if !place(&mut absent, path, None, true)
                || !place(&mut set, path, Some(&value_from(value)), true)
            {
                continue; // this catalog has no place for the field
            }
            let (absent, set) = (load(&absent), load(&set));
            if absent.is_err() {
                continue; // the field is required here (a created section needs more)
            }
            checked.insert(path.join("."));
            if absent != set {
                wrong.push(format!(
                    "{} in {base}: stated default {value:?}",
                    path.join(".")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "stated defaults the loader does not apply:\n{}",
        wrong.join("\n")
    );
    let simple: std::collections::BTreeSet<String> =
        stated.iter().map(|(path, _)| path.join(".")).collect();
    let unchecked: Vec<&String> = simple.difference(&checked).collect();
    assert!(
        unchecked.is_empty(),
        "stated defaults no example catalog has a place for: {unchecked:?}"
    );
    assert!(
        checked.len() >= 50,
        "{} checked: {checked:?}",
        checked.len()
    );
}
/// `(default X)` where X is one value (a number, a duration, a word, `true`/`false`, a
/// backticked or quoted string), with the path of the field that states it; `[]` in a path is
/// every element of a list, `*` every entry of a map.
fn collect_stated_defaults(
    root: &serde_json::Value,
    node: &serde_json::Value,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    let node = resolve(root, node);
    if let Some(value) = node
        .get("description")
        .and_then(|d| d.as_str())
        .and_then(stated_default)
    {
        out.push((path.clone(), value));
    }
    let mut variants: Vec<&serde_json::Value> = vec![node];
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = node.get(key).and_then(|l| l.as_array()) {
            variants.extend(list.iter().map(|v| resolve(root, v)));
        }
    }
    for variant in variants {
        if let Some(properties) = variant.get("properties").and_then(|p| p.as_object()) {
            for (name, property) in properties {
                path.push(name.clone());
                collect_stated_defaults(root, property, path, out);
                path.pop();
            }
        }
        if path.len() > 6 {
            continue;
        }
        if let Some(items) = variant.get("items") {
            path.push("[]".into());
            collect_stated_defaults(root, items, path, out);
            path.pop();
        }
        if let Some(entries) = variant
            .get("additionalProperties")
            .filter(|e| e.is_object())
        {
            path.push("*".into());
            collect_stated_defaults(root, entries, path, out);
            path.pop();
        }
    }
}

fn resolve<'a>(root: &'a serde_json::Value, node: &'a serde_json::Value) -> &'a serde_json::Value {
    match node.get("$ref").and_then(|r| r.as_str()) {
        Some(reference) => root
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or(node),
        None => node,
    }
}

fn stated_default(description: &str) -> Option<String> {
    let start = description.find("(default ")? + "(default ".len();
    let rest = &description[start..];
    let end = rest.find([')', ',', ';'])?;
    let value = rest[..end].trim();
    let value = value.trim_matches('`').trim_matches('"');
    let simple = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
    simple.then(|| value.to_owned())
}

fn value_from(text: &str) -> serde_yaml_ng::Value {
    // A number or a boolean as YAML reads it; anything else (30s, deny, 127.0.0.1:50051) a string.
    match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
        Ok(value @ (serde_yaml_ng::Value::Number(_) | serde_yaml_ng::Value::Bool(_))) => value,
        _ => serde_yaml_ng::Value::String(text.to_owned()),
    }
}

/// Sets `path` to `value` (or removes it, for `None`) everywhere it can be: in every element
/// of a list (`[]`) and every entry of a map (`*`); a missing top-level section is created.
/// Whether any place took it.
fn place(
    node: &mut serde_yaml_ng::Value,
    path: &[String],
    value: Option<&serde_yaml_ng::Value>,
    top: bool,
) -> bool {
    use serde_yaml_ng::Value as Yaml;
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match first.as_str() {
        "[]" => node.as_sequence_mut().is_some_and(|items| {
            items
                .iter_mut()
                .map(|item| place(item, rest, value, false))
                .fold(false, |any, took| any | took)
        }),
        "*" => node.as_mapping_mut().is_some_and(|entries| {
            entries
                .values_mut()
                .map(|entry| place(entry, rest, value, false))
                .fold(false, |any, took| any | took)
        }),
        key => {
            let Some(map) = node.as_mapping_mut() else {
                return false;
            };
            let key = Yaml::String(key.to_owned());
            if rest.is_empty() {
                match value {
                    Some(value) => map.insert(key, value.clone()),
                    None => map.remove(&key),
                };
                return true;
            }
            if !map.contains_key(&key) {
                // Only a top-level section of plain settings is created (a nested one, such as
                // identity.jwt, needs settings of its own); lists and maps of entries are
                // filled where the catalog has them.
                if !top || rest.first().is_some_and(|r| r == "[]" || r == "*") {
                    return false;
                }
                map.insert(key.clone(), Yaml::Mapping(Default::default()));
            }
            place(&mut map[&key], rest, value, false)
        }
    }
}
