//! Stage 12b: the output guard. A tool's output — and the error text of a backend that failed,
//! which reaches the model too — is screened by the tool's detectors before anything keeps or
//! returns it (the idempotency store, the response, the MCP door's structured content): what a
//! redacting detector finds is replaced with `[REDACTED:<detector>]`; when a blocking one finds
//! anything, the output is withheld and the call ends `ERROR`/`output_blocked`, telling the model
//! that and why, never what. The call's record keeps which detectors fired and how often, never
//! the values.

use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
    output_guard::{Action, Finding},
};

/// `result` as the model may see it, and what the detectors found. The chain's stage, and what
/// `toolgate test` applies to a case's sample output.
pub fn screen(
    tool: &ToolVersion,
    result: Result<String, Refusal>,
) -> (Result<String, Refusal>, Vec<Finding>) {
    let guard = &tool.output_guard;
    if guard.is_off() {
        return (result, Vec::new());
    }
    match result {
        Ok(output) => {
            let screened = guard.screen(&output);
            let findings = screened.findings;
            if screened.blocked {
                let refusal = blocked(&tool.name, "its output was withheld", &findings);
                return (Err(refusal), findings);
            }
            let output = match screened.text {
                std::borrow::Cow::Borrowed(_) => output,
                std::borrow::Cow::Owned(redacted) => redacted,
            };
            (Ok(output), findings)
        }
        Err(mut refusal) => {
            let Some(detail) = refusal.detail.take() else {
                return (Err(refusal), Vec::new());
            };
            let screened = guard.screen(&detail);
            let findings = screened.findings;
            if screened.blocked {
                let message = format!(
                    "{} ({}); its error text was withheld",
                    refusal.message,
                    refusal.reason.code()
                );
                let mut refusal = blocked(&tool.name, &message, &findings);
                refusal.stage = Stage::Execute;
                return (Err(refusal), findings);
            }
            if !findings.is_empty() {
                // What records may carry is made from the screened text as well.
                refusal.recorded_detail = refusal
                    .recorded_detail
                    .take()
                    .map(|recorded| guard.screen(&recorded).text.into_owned());
            }
            refusal.detail = Some(screened.text.into_owned());
            (Err(refusal), findings)
        }
    }
}

/// The refusal of an output a blocking detector found something in: which detectors, and how
/// many matches, never what they matched.
fn blocked(tool: &str, what: &str, findings: &[Finding]) -> Refusal {
    let found = findings
        .iter()
        .filter(|f| f.action == Action::Block)
        .map(|f| {
            let plural = if f.matches == 1 { "" } else { "es" };
            format!("{} ({} match{plural})", f.detector, f.matches)
        })
        .collect::<Vec<_>>()
        .join(", ");
    Refusal::new(
        Stage::Result,
        Reason::OutputBlocked,
        format!(
            "{tool} ran, but {what}: the catalog's output guard blocks what it carried: {found}"
        ),
    )
}
