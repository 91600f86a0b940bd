//! The `requestState` of an approval the door asked a 2026-07-28 host to get: the approval's id,
//! sealed (HMAC, rmcp's codec) to the caller and the tool it was created for, with the approvals'
//! lifetime. The host echoes it on its retry; nothing in it approves anything — the boundary still
//! checks that the approval was decided by someone else, binds these exact arguments, and is
//! used once.

use std::time::Duration;

use rmcp::model::{RequestStateCodec, SealOptions};
use serde::{Deserialize, Serialize};

use crate::identity::Caller;

/// Seals and opens approval states with one key.
#[derive(Clone)]
pub struct ApprovalStates {
    codec: RequestStateCodec,
    ttl: Duration,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    approval_id: String,
}

/// Why an echoed state was not accepted. One answer for every cause, to the host; the cause only
/// in the log.
#[derive(Debug, thiserror::Error)]
#[error("requestState was not issued by this sidecar for this caller and tool, or has expired")]
pub struct NotOurs;

impl ApprovalStates {
    /// `key`: at least 32 bytes (checked when the config was loaded, or made here).
    pub fn new(key: Option<&[u8]>, ttl: Duration) -> Self {
        let key = match key {
            Some(key) => key.to_vec(),
            // No key configured: one for this process (a retry must reach this replica).
            None => [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
                .iter()
                .flat_map(|id| *id.as_bytes())
                .collect(),
        };
        ApprovalStates {
            codec: RequestStateCodec::new_unchecked(key),
            ttl,
        }
    }

    pub fn seal(&self, caller: &Caller, tool: &str, approval_id: &str) -> String {
        let bound = bound_to(caller, tool);
        let options = SealOptions::new().associated_data(&bound).ttl(self.ttl);
        let sealed = Sealed {
            approval_id: approval_id.to_owned(),
        };
        // A struct of one string always serializes; an empty state is refused on its way back.
        self.codec
            .seal_json_with(&sealed, &options)
            .unwrap_or_default()
    }

    /// The approval id sealed in `state`, if it was sealed for this caller and tool and has not
    /// expired.
    pub fn open(&self, state: &str, caller: &Caller, tool: &str) -> Result<String, NotOurs> {
        self.codec
            .open_json_with::<Sealed>(state, &bound_to(caller, tool))
            .map(|sealed| sealed.approval_id)
            .map_err(|err| {
                tracing::info!(error = %err, "an MCP host echoed a requestState that does not open");
                NotOurs
            })
    }
}

/// What a state is sealed to: the caller (tenant, subject, agent) and the tool, length-prefixed
/// so no two different tuples make the same bytes.
fn bound_to(caller: &Caller, tool: &str) -> Vec<u8> {
    let mut bound = Vec::new();
    for part in [
        &*caller.tenant,
        caller.subject.as_str(),
        &*caller.agent,
        tool,
    ] {
        bound.extend_from_slice(&(part.len() as u64).to_be_bytes());
        bound.extend_from_slice(part.as_bytes());
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(tenant: &str) -> Caller {
        Caller {
            tenant: tenant.into(),
            subject: "alice".into(),
            agent: "bot".into(),
            scopes: Default::default(),
            method: crate::identity::AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        }
    }

    #[test]
    fn a_state_opens_only_for_its_caller_and_tool() {
        let states = ApprovalStates::new(None, Duration::from_secs(60));
        let sealed = states.seal(&caller("acme"), "deploy", "ap-1");
        assert_eq!(
            states.open(&sealed, &caller("acme"), "deploy").unwrap(),
            "ap-1"
        );
        assert!(states.open(&sealed, &caller("globex"), "deploy").is_err());
        assert!(states.open(&sealed, &caller("acme"), "delete").is_err());
        let other_key = ApprovalStates::new(None, Duration::from_secs(60));
        assert!(other_key.open(&sealed, &caller("acme"), "deploy").is_err());
        let mut tampered = sealed.clone();
        tampered.pop();
        assert!(states.open(&tampered, &caller("acme"), "deploy").is_err());
    }
}
