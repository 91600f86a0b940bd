//! What the cases covered: every tool, every deny rule, every condition.

use super::*;

/// What the cases covered, and the failures.
#[derive(Default)]
pub(super) struct Report {
    pub(super) passed: usize,
    pub(super) failed: Vec<String>,
    called: BTreeSet<String>,
    deny_rules_matched: BTreeSet<String>,
    /// Conditions (by location) seen true, and seen false, in some case.
    conditions_held: BTreeSet<String>,
    conditions_not_held: BTreeSet<String>,
    /// Flow rules (by location) that decided some case.
    flow_rules_fired: BTreeSet<String>,
}

impl Report {
    pub(super) fn fail(&mut self, index: usize, case: &TestCase, diff: String) {
        println!("FAIL  {} (cases[{index}])\n{diff}", case.name);
        self.failed.push(case.name.clone());
    }

    pub(super) fn seen_call(&mut self, name: &str, explained: &Explanation) {
        self.called.insert(name.to_owned());
        for evaluated in &explained.conditions {
            match evaluated.value {
                Ok(Found::Holds(true)) => self.conditions_held.insert(evaluated.location.clone()),
                Ok(Found::Holds(false)) => {
                    self.conditions_not_held.insert(evaluated.location.clone())
                }
                // An error decides closed; it shows neither way the condition can go. A cost is
                // not a rule.
                Ok(Found::Cost(_)) | Err(_) => false,
            };
        }
        if let Some(rule) = explained.deciding_rule()
            && rule.effect == "deny"
        {
            self.deny_rules_matched.insert(rule.location.clone());
        }
        if let Some((_, location, _)) = explained.flow.as_ref().and_then(|f| f.rule.as_ref()) {
            self.flow_rules_fired.insert(location.clone());
        }
    }

    pub(super) fn seen_listing(&mut self, listing: &[Visibility]) {
        for rule in listing.iter().filter_map(|t| t.rule.as_ref()) {
            if rule.effect == "deny" {
                self.deny_rules_matched.insert(rule.location.clone());
            }
        }
    }
}

/// Every access list of the catalog: global, tenants', agents'.
pub(super) fn access_lists(catalog: &Catalog) -> impl Iterator<Item = &AccessList> {
    std::iter::once(&catalog.policy)
        .chain(catalog.tenants.values().map(|t| &t.access))
        .chain(catalog.agents.named.values())
        .chain(catalog.agents.default.iter())
}

/// Every deny rule of the catalog, by location.
pub(super) fn deny_rules(catalog: &Catalog) -> Vec<(String, String)> {
    access_lists(catalog)
        .flat_map(|list| &list.deny)
        .map(|p| (p.location.clone(), p.text.clone()))
        .collect()
}

/// Every condition of the catalog: (location, expression), once per entry.
pub(super) fn conditions(catalog: &Catalog) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = access_lists(catalog)
        .flat_map(|list| list.deny.iter().chain(list.allow.iter().flatten()))
        .filter_map(|p| Some((p.location.clone(), p.when.as_ref()?.source().to_owned())))
        .collect();
    found.extend(catalog.versions().filter_map(|tool| {
        let when = tool.approval_when.as_ref()?;
        Some((approval_condition_location(tool), when.source().to_owned()))
    }));
    found.sort();
    found.dedup();
    found
}

/// Prints coverage; true when every tool has a case, every deny rule decided one and every
/// condition held in one case and did not in another.
pub(super) fn print_coverage(catalog: &Catalog, report: &Report) -> bool {
    let tools: BTreeSet<&str> = catalog.names().chain(catalog.unavailable_names()).collect();
    let uncovered: Vec<&str> = tools
        .iter()
        .filter(|t| !report.called.contains(**t))
        .copied()
        .collect();
    let rules = deny_rules(catalog);
    let unmatched: Vec<&(String, String)> = rules
        .iter()
        .filter(|(location, _)| !report.deny_rules_matched.contains(location))
        .collect();
    println!(
        "coverage: {}/{} tools have a case; {}/{} deny rules decided a case",
        tools.len() - uncovered.len(),
        tools.len(),
        rules.len() - unmatched.len(),
        rules.len()
    );
    for tool in &uncovered {
        println!("  no case calls tool {tool}");
    }
    for (location, pattern) in &unmatched {
        println!("  deny rule {location} ({pattern:?}) decided no case");
    }
    let conditions = conditions(catalog);
    let mut half_covered = Vec::new();
    for (location, expression) in &conditions {
        let held = report.conditions_held.contains(location);
        let not_held = report.conditions_not_held.contains(location);
        if !held {
            half_covered.push(format!(
                "  condition {location} ({expression:?}) held in no case"
            ));
        }
        if !not_held {
            half_covered.push(format!(
                "  condition {location} ({expression:?}) was false in no case"
            ));
        }
    }
    if !conditions.is_empty() {
        let both = conditions
            .iter()
            .filter(|(l, _)| {
                report.conditions_held.contains(l) && report.conditions_not_held.contains(l)
            })
            .count();
        println!(
            "conditions: {both}/{} held in one case and were false in another",
            conditions.len()
        );
    }
    for line in &half_covered {
        println!("{line}");
    }
    let flow_rules = catalog.flow.as_deref().map_or(&[][..], |f| &f.rules[..]);
    let unfired: Vec<_> = flow_rules
        .iter()
        .filter(|r| !report.flow_rules_fired.contains(&r.location))
        .collect();
    if !flow_rules.is_empty() {
        println!(
            "flow rules: {}/{} decided a case",
            flow_rules.len() - unfired.len(),
            flow_rules.len()
        );
    }
    for rule in &unfired {
        println!(
            "  flow rule {} ({}) decided no case: give a case a history",
            rule.location, rule.name
        );
    }
    uncovered.is_empty() && unmatched.is_empty() && half_covered.is_empty() && unfired.is_empty()
}
