//! Stage 10 explained: what a call's idempotency key would find, claimed by no one.

use super::{
    super::{
        CallRequest, Turn,
        explain::{Ending, Explainer, StageResult, StageTrail},
        policy::{self, Decided},
    },
    Peek,
};
use crate::error::Stage;

impl Explainer<'_> {
    /// Stage 10, peeking at the key and claiming nothing: how the call would end.
    pub(in crate::boundary) async fn idempotency(
        &self,
        turn: &Turn,
        call: &CallRequest,
        decided: &Decided<'_>,
        approval_id: Option<String>,
        stages: &mut Vec<StageTrail>,
    ) -> Ending {
        let caller = &turn.caller;
        let tool = decided.tool;
        let Some(key) = call.idempotency_key.as_deref() else {
            stages.push(StageTrail::new(
                Stage::Idempotency,
                StageResult::NotApplicable,
                "no idempotency key: the call would run every time it is sent",
            ));
            return Ending::Execute { approval_id };
        };
        let window = humantime::format_duration(self.boundary.limits.idempotency_window);
        let peek = match self.own.idempotency_key {
            true => Peek::Fresh,
            false => match self
                .boundary
                .idempotency
                .peek(
                    &policy::idempotency_key(caller, tool, key),
                    &decided.arguments_sha256,
                    &tool.version,
                )
                .await
            {
                Ok(peek) => peek,
                Err(refusal) => {
                    stages.push(StageTrail::new(
                        Stage::Idempotency,
                        StageResult::Refused,
                        refusal.message.clone(),
                    ));
                    return Ending::Refused(refusal);
                }
            },
        };
        let passed =
            |detail: String| StageTrail::new(Stage::Idempotency, StageResult::Passed, detail);
        match peek {
            Peek::Fresh => {
                stages.push(passed(format!(
                    "key {key:?} is new for this caller and tool: the call would run, and its final result be kept for replays for {window}"
                )));
                Ending::Execute { approval_id }
            }
            Peek::InFlight => {
                stages.push(passed(format!(
                    "a call with key {key:?} and these arguments is running: this one would wait for it and return its result"
                )));
                Ending::Replay {
                    result: Ok(()),
                    tool_version: tool.version.to_string(),
                }
            }
            Peek::Replay(stored) => {
                let status = match &stored.result {
                    Ok(_) => "OK".to_owned(),
                    Err(refusal) => {
                        format!("{} ({})", refusal.status().as_str(), refusal.reason.code())
                    }
                };
                stages.push(passed(format!(
                    "key {key:?} was used with these arguments within {window}: the stored result of the first call ({status}, version {}) would be replayed without running the tool",
                    stored.tool_version
                )));
                Ending::Replay {
                    result: stored.result.map(|_| ()),
                    tool_version: stored.tool_version,
                }
            }
            Peek::Conflict => {
                let refusal = super::conflict(key);
                stages.push(StageTrail::new(
                    Stage::Idempotency,
                    StageResult::Refused,
                    refusal.message.clone(),
                ));
                Ending::Refused(refusal)
            }
        }
    }
}
