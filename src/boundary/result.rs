//! Stage 12: the result. A tool's output over its `max_output_bytes` is an error; and a batch's
//! results share one response of at most `limits.max_message_bytes`, so a result that would not
//! fit comes back on its own as a short `output_too_large` refusal (saying whether the tool ran)
//! while the others are returned.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage, Status},
    outcome::CallOutcome,
    settings::{RESPONSE_MARGIN_BYTES, RESULT_RESERVE_BYTES},
};

/// Refuses output over the tool's limit.
pub(super) fn check_output(tool: &ToolVersion, output: &str) -> Result<(), Refusal> {
    if output.len() > tool.max_output_bytes {
        return Err(Refusal::new(
            Stage::Result,
            Reason::OutputTooLarge,
            format!(
                "the tool's output is {} bytes; the limit is {}",
                output.len(),
                tool.max_output_bytes
            ),
        ));
    }
    Ok(())
}

/// The bytes of results one response may still carry. A batch's results share the gRPC message
/// limit: a result that would overflow it comes back on its own as a short `output_too_large`
/// refusal, and the others are returned, instead of the whole response failing after the calls
/// ran. Each result has room for such a refusal set aside from the start.
#[derive(Debug)]
pub struct ResponseBudget {
    left: AtomicUsize,
}

impl ResponseBudget {
    /// The budget for `calls` results in a message of at most `max_message_bytes`.
    pub fn new(max_message_bytes: usize, calls: usize) -> Self {
        let reserved = RESPONSE_MARGIN_BYTES + calls.saturating_mul(RESULT_RESERVE_BYTES);
        ResponseBudget {
            left: AtomicUsize::new(max_message_bytes.saturating_sub(reserved)),
        }
    }

    /// Takes room for an outcome beyond its reserve, if there is enough.
    pub(super) fn take(&self, outcome: &CallOutcome) -> bool {
        let refusal_text = outcome.refusal.as_ref().map_or(0, |r| {
            r.message.len() + r.detail.as_ref().map_or(0, String::len) + 64
        });
        let size = outcome.model_text.len()
            + refusal_text
            + outcome.call_id.len()
            + outcome.tool.len()
            + outcome.tool_version.len()
            + outcome.approval_id.as_ref().map_or(0, String::len)
            + 64;
        let Some(excess) = size.checked_sub(RESULT_RESERVE_BYTES) else {
            return true;
        };
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(excess)
            })
            .is_ok()
    }
}

/// An outcome that does not fit in what is left of the response.
pub(super) fn over_budget(outcome: CallOutcome) -> CallOutcome {
    let size = outcome.model_text.len();
    let message = match outcome.status {
        Status::Ok => format!(
            "the tool ran, but its output ({size} bytes) does not fit in what is left of this response; it was not returned — call it on its own (with an idempotency key, the repeat returns the stored result)"
        ),
        status => format!(
            "the call ended {} ({}), but its result ({size} bytes) does not fit in what is left of this response — call it on its own to see it",
            status.as_str(),
            outcome.refusal.as_ref().map_or("", |r| r.reason.code()),
        ),
    };
    let refusal = Refusal::new(Stage::Result, Reason::OutputTooLarge, message);
    let mut refused =
        CallOutcome::refused(outcome.call_id, outcome.tool, outcome.tool_version, refusal);
    refused.approval_id = outcome.approval_id;
    refused
}
