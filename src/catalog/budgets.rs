//! Budgets for a whole run and for a caller over a day, as the catalog declares them (`budgets:`).
//! What each run and caller has spent lives in `crate::budgets`.

use std::{collections::BTreeMap, time::Duration};

use crate::settings::{
    FieldError, parse_duration,
    raw::{RawBudget, RawBudgets, RawHandoff},
};

/// Runs (and, apart, callers) a tenant's spending is remembered for in memory unless the catalog
/// says otherwise.
pub const DEFAULT_MAX_ENTRIES_PER_TENANT: usize = 10_000;
/// The most a catalog may let a tenant keep.
pub const MAX_ENTRIES_PER_TENANT: usize = 1_000_000;
/// Most tools one budget may count apart.
pub const MAX_TOOLS_PER_BUDGET: usize = 64;
/// How long a run's spending is remembered after its last call, unless the catalog says.
pub const DEFAULT_RUN_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// One budget's limits; `None` is no limit of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    pub max_calls: Option<u64>,
    pub max_cost: Option<u64>,
    pub max_calls_per_tool: BTreeMap<String, u64>,
    pub max_wall_time: Option<Duration>,
}

/// The catalog's `budgets` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPolicy {
    pub run: Option<Budget>,
    pub caller_daily: Option<Budget>,
    /// At least the run budget's `max_wall_time`.
    pub run_window: Duration,
    pub max_entries_per_tenant: usize,
}

impl BudgetPolicy {
    pub fn build(raw: &RawBudgets) -> Result<Self, FieldError> {
        let run = raw
            .run
            .as_ref()
            .map(|b| Budget::build(b, "budgets.run", true))
            .transpose()?;
        let caller_daily = raw
            .caller_daily
            .as_ref()
            .map(|b| Budget::build(b, "budgets.caller_daily", false))
            .transpose()?;
        if run.is_none() && caller_daily.is_none() {
            return Err(FieldError::new(
                "budgets",
                "declares no budget: give `run`, `caller_daily` or both",
            ));
        }
        let window = match &raw.run_window {
            None => DEFAULT_RUN_WINDOW,
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new("budgets.run_window", err.to_string()))?,
        };
        let wall = run.as_ref().and_then(|r| r.max_wall_time);
        if let (Some(wall), Some(_)) = (wall, &raw.run_window)
            && window < wall
        {
            return Err(FieldError::new(
                "budgets.run_window",
                "is shorter than budgets.run.max_wall_time: a run would be forgotten (and its wall time restart) before its time is up",
            ));
        }
        let max_entries_per_tenant = match raw.max_entries_per_tenant {
            None => DEFAULT_MAX_ENTRIES_PER_TENANT,
            Some(n @ 1..=MAX_ENTRIES_PER_TENANT) => n,
            Some(n) => {
                return Err(FieldError::new(
                    "budgets.max_entries_per_tenant",
                    format!("{n} is out of range: 1 to {MAX_ENTRIES_PER_TENANT}"),
                ));
            }
        };
        Ok(BudgetPolicy {
            run,
            caller_daily,
            run_window: window.max(wall.unwrap_or_default()),
            max_entries_per_tenant,
        })
    }
}

impl Budget {
    fn build(raw: &RawBudget, path: &str, run: bool) -> Result<Self, FieldError> {
        let max_wall_time = match (&raw.max_wall_time, run) {
            (None, _) => None,
            (Some(_), false) => {
                return Err(FieldError::new(
                    format!("{path}.max_wall_time"),
                    "only a run's budget has a wall time",
                ));
            }
            (Some(text), true) => Some(parse_duration(text).map_err(|err| {
                FieldError::new(format!("{path}.max_wall_time"), err.to_string())
            })?),
        };
        if raw.max_calls_per_tool.len() > MAX_TOOLS_PER_BUDGET {
            return Err(FieldError::new(
                format!("{path}.max_calls_per_tool"),
                format!("at most {MAX_TOOLS_PER_BUDGET} tools"),
            ));
        }
        for name in raw.max_calls_per_tool.keys() {
            let valid =
                !name.is_empty() && name.len() <= 128 && name.bytes().all(|b| b.is_ascii_graphic());
            if !valid {
                return Err(FieldError::new(
                    format!("{path}.max_calls_per_tool"),
                    format!("{name:?} is not a tool name"),
                ));
            }
        }
        let budget = Budget {
            max_calls: raw.max_calls,
            max_cost: raw.max_cost,
            max_calls_per_tool: raw.max_calls_per_tool.clone(),
            max_wall_time,
        };
        if budget.is_empty() {
            return Err(FieldError::new(
                path,
                "sets no limit: give max_calls, max_cost, max_calls_per_tool or max_wall_time",
            ));
        }
        Ok(budget)
    }

    /// Whether it limits nothing.
    pub fn is_empty(&self) -> bool {
        self.max_calls.is_none()
            && self.max_cost.is_none()
            && self.max_calls_per_tool.is_empty()
            && self.max_wall_time.is_none()
    }

    /// The most calls of `tool` it admits, if it counts that tool apart.
    pub fn tool_limit(&self, tool: &str) -> Option<u64> {
        self.max_calls_per_tool.get(tool).copied()
    }
}

/// The depth a handoff allows unless it says.
pub const DEFAULT_MAX_DEPTH: u32 = 2;

/// A tool's handoff (`handoff:`): the sub-agent, the tools it may use, the chain's depth and
/// what it may spend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    pub agent: String,
    pub tools: crate::identity::delegation::ToolLists,
    pub max_depth: u32,
    pub budget: Option<Budget>,
}

impl Handoff {
    pub fn build(raw: &RawHandoff, at: &str) -> Result<Self, FieldError> {
        let agent = raw.agent.trim();
        if agent.is_empty() || agent.len() > 256 || agent.chars().any(char::is_control) {
            return Err(FieldError::new(
                format!("{at}.agent"),
                "must be an agent name: 1-256 printable characters",
            ));
        }
        if raw.allow.is_empty() {
            return Err(FieldError::new(
                format!("{at}.allow"),
                "names no tool: a sub-agent may use only what its handoff lists",
            ));
        }
        for (field, patterns) in [("allow", &raw.allow), ("deny", &raw.deny)] {
            for (i, pattern) in patterns.iter().enumerate() {
                globset::Glob::new(pattern).map_err(|err| {
                    FieldError::new(
                        format!("{at}.{field}[{i}]"),
                        format!("invalid glob {pattern:?}: {err}"),
                    )
                })?;
            }
        }
        let max_depth = match raw.max_depth {
            None => DEFAULT_MAX_DEPTH,
            Some(n @ 1..=crate::identity::delegation::MAX_DEPTH) => n,
            Some(n) => {
                return Err(FieldError::new(
                    format!("{at}.max_depth"),
                    format!(
                        "{n} is out of range: 1 to {}",
                        crate::identity::delegation::MAX_DEPTH
                    ),
                ));
            }
        };
        let budget = raw
            .budget
            .as_ref()
            .map(|b| Budget::build(b, &format!("{at}.budget"), false))
            .transpose()?;
        Ok(Handoff {
            agent: agent.to_owned(),
            tools: crate::identity::delegation::ToolLists {
                allow: raw.allow.clone(),
                deny: raw.deny.clone(),
            },
            max_depth,
            budget,
        })
    }
}
