//! Comparing what a case expects with what the chain explained, as a readable diff.

use super::*;

/// A case's sample output, screened as the sidecar screens the output of a call that runs:
/// the explanation's outcome becomes what the model would get. `None` without an output or
/// when the call would not run.
pub(super) fn screen_output(
    boundary: &Boundary,
    caller: &Caller,
    call: &TestCall,
    explained: &mut Explanation,
) -> Option<Vec<crate::output_guard::Finding>> {
    let output = call.output.as_ref()?;
    if !explained.would_execute {
        return None;
    }
    let catalog = boundary.catalog();
    let outcome = &explained.outcome;
    let tool = catalog
        .catalog
        .resolve(&call.name, Some(&outcome.tool_version), &caller.tenant)
        .ok()?;
    let (result, findings) = crate::boundary::output_guard::screen(tool, Ok(output.clone()));
    let (call_id, name, version) = (
        outcome.call_id.clone(),
        outcome.tool.clone(),
        outcome.tool_version.clone(),
    );
    explained.outcome = match result {
        Ok(text) => crate::outcome::CallOutcome::ok(call_id, name, version, text),
        Err(refusal) => crate::outcome::CallOutcome::refused(call_id, name, version, refusal),
    };
    Some(findings)
}

pub(super) fn compare_output(
    expect: &Expectation,
    explained: &Explanation,
    findings: Option<&[crate::output_guard::Finding]>,
) -> String {
    let mut diff = String::new();
    let Some(findings) = findings else {
        if expect.model_text.is_some() || expect.output_guard.is_some() {
            diff.push_str("  model_text: the call would not run, so its output was not screened\n");
        }
        return diff;
    };
    if let Some(expected) = &expect.model_text
        && *expected != explained.outcome.model_text
    {
        let _ = writeln!(
            diff,
            "  model_text: expected {expected:?}, got {:?}",
            explained.outcome.model_text
        );
    }
    if let Some(expected) = &expect.output_guard {
        let got: BTreeMap<String, usize> = findings
            .iter()
            .map(|f| (f.detector.to_string(), f.matches))
            .collect();
        if *expected != got {
            let _ = writeln!(diff, "  output_guard: expected {expected:?}, got {got:?}");
        }
    }
    diff
}

/// Every expected field that differs, one line each: `field: expected X, got Y`.
pub(super) fn compare_call(expect: &Expectation, explained: &Explanation) -> String {
    let mut diff = String::new();
    let outcome = &explained.outcome;
    let refusal = outcome.refusal.as_ref();
    let mut check = |field: &str, expected: Option<String>, got: String| {
        if let Some(expected) = expected
            && expected != got
        {
            let got = if got.is_empty() { "(none)".into() } else { got };
            let _ = writeln!(diff, "  {field}: expected {expected}, got {got}");
        }
    };
    check(
        "status",
        expect.status.clone(),
        outcome.status.as_str().to_owned(),
    );
    check(
        "error_type",
        expect.error_type.clone(),
        refusal
            .map(|r| r.reason.code().to_owned())
            .unwrap_or_default(),
    );
    check(
        "refused_by",
        expect.refused_by.clone(),
        refusal
            .map(|r| r.stage.as_str().to_owned())
            .unwrap_or_default(),
    );
    check(
        "rule",
        expect.rule.clone(),
        explained
            .deciding_rule()
            .map(|r| r.location.clone())
            .unwrap_or_default(),
    );
    check(
        "flow_rule",
        expect.flow_rule.clone(),
        explained
            .flow
            .as_ref()
            .and_then(|f| f.rule.as_ref())
            .map(|(name, _, _)| name.clone())
            .unwrap_or_default(),
    );
    check(
        "tool_version",
        expect.tool_version.clone(),
        outcome.tool_version.clone(),
    );
    if let Some(expected) = &expect.bound_arguments {
        let bound: BTreeMap<String, Value> = explained
            .stages
            .iter()
            .flat_map(|s| &s.bound)
            .map(|b| (b.path.clone(), b.value.clone()))
            .collect();
        for (path, value) in expected {
            match bound.get(path) {
                Some(got) if got == value => {}
                Some(got) => {
                    let _ = writeln!(
                        diff,
                        "  bound_arguments.{path}: expected {value}, got {got}"
                    );
                }
                None => {
                    let _ = writeln!(
                        diff,
                        "  bound_arguments.{path}: expected {value}, got nothing bound (the call did not reach bind, or the tool binds no {path})"
                    );
                }
            }
        }
    }
    if let Some(expected) = &expect.arguments {
        let mut expected = expected.clone();
        crate::canonical::normalize(&mut expected);
        match &explained.arguments {
            Some(got) if *got == expected => {}
            Some(got) => {
                let _ = writeln!(
                    diff,
                    "  arguments: expected {}, got {}",
                    crate::canonical::to_string(&expected),
                    crate::canonical::to_string(got)
                );
            }
            None => {
                let _ = writeln!(
                    diff,
                    "  arguments: expected {}, got none (refused before bind)",
                    crate::canonical::to_string(&expected)
                );
            }
        }
    }
    diff
}

pub(super) fn compare_tools(
    expect: &ToolsExpectation,
    listing: &[Visibility],
    caller: &Caller,
) -> String {
    let mut diff = String::new();
    let visible: BTreeSet<&str> = listing
        .iter()
        .filter(|t| t.hidden_by.is_none())
        .map(|t| t.name.as_str())
        .collect();
    let why_hidden = |name: &str| {
        listing
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.hidden_by.as_ref())
            .map(|r| format!("hidden by {} [{}]: {}", r.stage, r.reason.code(), r.message))
            .unwrap_or_else(|| "not in the catalog".to_owned())
    };
    for name in &expect.visible {
        if !visible.contains(name.as_str()) {
            let _ = writeln!(
                diff,
                "  tools: expected {name} visible, got {}",
                why_hidden(name)
            );
        }
    }
    for name in &expect.hidden {
        if visible.contains(name.as_str()) {
            let _ = writeln!(diff, "  tools: expected {name} hidden, got visible");
        }
    }
    if let Some(exactly) = &expect.exactly {
        let expected: BTreeSet<&str> = exactly.iter().map(String::as_str).collect();
        if expected != visible {
            let missing: Vec<_> = expected.difference(&visible).collect();
            let extra: Vec<_> = visible.difference(&expected).collect();
            let _ = writeln!(
                diff,
                "  tools: expected exactly {expected:?}, got {visible:?} (missing {missing:?}, extra {extra:?})"
            );
        }
    }
    if !diff.is_empty() {
        let _ = writeln!(diff, "  as {}", describe(caller));
    }
    diff
}
