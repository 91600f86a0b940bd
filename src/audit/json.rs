//! An audit event's JSON line, written field by field: byte for byte what serde_json makes of the
//! derived `Serialize` (the tests compare the two), at a fraction of the cost. serde_json looks
//! at every byte of every string through a table, and `#[serde(flatten)]` turns the event into a
//! map of ~20 entries, each a trip through the serializer; this was the audit writer thread's
//! whole cost (docs/performance.md). Shadow decisions, tool definition changes and emergency
//! denies (records of their own, rare) take serde's path.

use crate::canonical::write_string;

use super::{AuditEvent, EventKind};

/// `"name":`, made at compile time. Field names need no escaping.
macro_rules! key {
    ($name:literal) => {
        concat!("\"", $name, "\":")
    };
}

impl AuditEvent {
    /// Appends the event as one JSON object (no line break).
    /// Line and bidirectional controls (U+2028, U+202E, …) are escaped: one event stays one
    /// line for every reader, and reads in its order.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let start = out.len();
        let written = self.write_json_raw(out);
        crate::canonical::escape_line_and_bidi_controls(out, start);
        written
    }

    fn write_json_raw(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        if self.shadow.is_some()
            || self.definition_change.is_some()
            || self.emergency_deny.is_some()
        {
            return serde_json::to_writer(out, self);
        }
        let mut object = Object::start(out);
        object.display(key!("time"), self.time);
        match self.kind {
            Some(kind) => object.string(key!("kind"), kind.as_str()),
            None => object.raw(key!("kind"), b"null"),
        }
        object.string(key!("call_id"), &self.call_id);
        object.string(key!("run_id"), &self.run_id);
        object.number(key!("step"), u64::from(self.step));
        object.optional_string(key!("door"), self.door);
        object.string(key!("tenant"), self.party.tenant());
        object.string(key!("subject"), self.party.subject());
        object.string(key!("agent"), self.party.agent());
        if let Some(delegation) = self.party.delegation() {
            serde_json::to_writer(&mut *object.key(key!("delegation")), &delegation)?;
        }
        object.string(key!("tool"), &self.tool);
        object.string(key!("tool_version"), &self.tool_version);
        object.optional_string(key!("risk_level"), self.risk_level);
        object.optional_string(key!("arguments_sha256"), self.arguments_sha256.as_deref());
        object.string(key!("status"), self.status);
        object.optional_string(key!("error_type"), self.error_type);
        object.optional_string(key!("refused_by"), self.refused_by);
        object.optional_string(key!("reason"), self.reason.as_deref());
        object.optional_string(key!("approval_id"), self.approval_id.as_deref());
        object.optional_string(key!("approver"), self.approver.as_deref());
        object.raw(
            key!("idempotent_replay"),
            if self.idempotent_replay {
                b"true"
            } else {
                b"false"
            },
        );
        object.strings(
            key!("bound_override_attempts"),
            &self.bound_override_attempts,
        );
        if !self.output_guard.is_empty() {
            let out = object.key(key!("output_guard"));
            out.push(b'[');
            for (i, finding) in self.output_guard.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(br#"{"detector":"#);
                write_string(&finding.detector, out);
                out.extend_from_slice(br#","matches":"#);
                out.extend_from_slice(finding.matches.to_string().as_bytes());
                out.extend_from_slice(br#","action":"#);
                write_string(finding.action.as_str(), out);
                out.push(b'}');
            }
            out.push(b']');
        }
        object.strings(key!("flow_labels"), &self.flow_labels);
        if let Some(credential) = &self.credential {
            serde_json::to_writer(&mut *object.key(key!("credential")), credential)?;
        }
        object.number(key!("duration_ms"), self.duration_ms);
        if let Some(trace_id) = self.trace_id {
            object.hex(key!("trace_id"), &trace_id.to_bytes());
        }
        if let Some(span_id) = self.span_id {
            object.hex(key!("span_id"), &span_id.to_bytes());
        }
        if let Some(arguments) = &self.arguments {
            serde_json::to_writer(&mut *object.key(key!("arguments")), arguments)?;
        }
        object.optional_string(key!("rpc"), self.rpc.as_deref());
        object.optional_string(key!("peer"), self.peer.as_deref());
        if let Some(suppressed) = self.suppressed {
            object.number(key!("suppressed"), suppressed);
        }
        object.end();
        Ok(())
    }
}

impl EventKind {
    /// As serde names it (`rename_all = "snake_case"`).
    fn as_str(self) -> &'static str {
        match self {
            EventKind::ToolCall => "tool_call",
            EventKind::ApprovalDecision => "approval_decision",
            EventKind::AuthenticationFailed => "authentication_failed",
            EventKind::ShadowDecision => "shadow_decision",
            EventKind::ToolDefinitionChanged => "tool_definition_changed",
            EventKind::EmergencyDeny => "emergency_deny",
        }
    }
}

/// A JSON object being written: commas between members, keys quoted.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn start(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, first: true }
    }

    /// An array of strings, left out when empty (as serde's `skip_serializing_if`).
    fn strings(&mut self, key: &str, items: &[String]) {
        if items.is_empty() {
            return;
        }
        let out = self.key(key);
        out.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(item, out);
        }
        out.push(b']');
    }

    /// Writes a member's `"name":` (from [`key!`]) and returns the buffer for its value.
    fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.extend_from_slice(key.as_bytes());
        self.out
    }

    fn raw(&mut self, key: &str, value: &[u8]) {
        self.key(key).extend_from_slice(value);
    }

    fn string(&mut self, key: &str, value: &str) {
        write_string(value, self.key(key));
    }

    fn optional_string(&mut self, key: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.string(key, value);
        }
    }

    /// A value whose text needs no escaping (a time), quoted.
    fn display(&mut self, key: &str, value: impl std::fmt::Display) {
        use std::io::Write;
        let out = self.key(key);
        out.push(b'"');
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{value}");
        out.push(b'"');
    }

    /// Lowercase hex of up to 16 bytes, quoted.
    fn hex(&mut self, key: &str, bytes: &[u8]) {
        let mut digits = [0; 32];
        let digits = &mut digits[..bytes.len() * 2];
        // `digits` is exactly twice as long as `bytes`: encoding cannot fail.
        let _ = hex::encode_to_slice(bytes, digits);
        let out = self.key(key);
        out.push(b'"');
        out.extend_from_slice(digits);
        out.push(b'"');
    }

    fn number(&mut self, key: &str, value: u64) {
        let mut digits = itoa::Buffer::new();
        self.raw(key, digits.format(value).as_bytes());
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opentelemetry::trace::{SpanId, TraceId};

    use super::*;
    use crate::{
        audit::{EventTime, Party},
        identity::{AuthMethod, Caller},
    };

    fn written(event: &AuditEvent) -> String {
        let mut out = Vec::new();
        event.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_field_is_written_as_serde_json_writes_it() {
        let tricky = "line\nbreak \"quoted\" \\ tab\t \u{1} é 漢字 \u{7f}";
        let full = AuditEvent {
            time: EventTime(1_796_119_200_123),
            kind: Some(EventKind::ApprovalDecision),
            call_id: tricky.into(),
            run_id: "run-1".into(),
            step: u32::MAX,
            door: Some("mcp"),
            party: Party::Named {
                tenant: "acme".into(),
                subject: tricky.into(),
                agent: "agent-7".into(),
            },
            tool: "rag_search".into(),
            tool_version: "2.1.0".into(),
            risk_level: Some("read_only"),
            arguments_sha256: Some("ab".repeat(32).into()),
            status: "REFUSED",
            error_type: Some("schema_invalid"),
            refused_by: Some("schema"),
            reason: Some(tricky.into()),
            approval_id: Some("ap-1".into()),
            approver: Some("ops@example.com".into()),
            idempotent_replay: true,
            bound_override_attempts: vec!["/tenant".into(), tricky.into()],
            output_guard: vec![
                crate::output_guard::Finding {
                    detector: "aws_access_key".into(),
                    matches: 2,
                    action: crate::output_guard::Action::Redact,
                },
                crate::output_guard::Finding {
                    detector: tricky.into(),
                    matches: 1,
                    action: crate::output_guard::Action::Block,
                },
            ],
            flow_labels: vec!["private_data".into(), tricky.into()],
            credential: Some(std::sync::Arc::new(crate::credentials::CredentialUsed {
                kind: "token_exchange",
                subject: Some(tricky.into()),
                actor: None,
                audience: Some("https://tickets.test".into()),
                fingerprint: "0123456789abcdef".into(),
            })),
            duration_ms: u64::MAX,
            trace_id: Some(TraceId::from_bytes([
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36,
            ])),
            span_id: Some(SpanId::from_bytes([
                0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7,
            ])),
            arguments: Some(serde_json::json!({"q": tricky, "n": [1, 2.5, null, true]})),
            rpc: Some("/toolgate.v1.ToolGate/ExecuteTool".into()),
            peer: Some("127.0.0.1:5000".into()),
            suppressed: Some(0),
            shadow: None,
            definition_change: None,
            emergency_deny: None,
        };
        let kinds = [
            None,
            Some(EventKind::ToolCall),
            Some(EventKind::ApprovalDecision),
            Some(EventKind::AuthenticationFailed),
            Some(EventKind::ShadowDecision),
            Some(EventKind::ToolDefinitionChanged),
            Some(EventKind::EmergencyDeny),
        ];
        for kind in kinds {
            for event in [
                AuditEvent {
                    kind,
                    ..full.clone()
                },
                AuditEvent {
                    kind,
                    ..AuditEvent::default()
                },
            ] {
                assert_eq!(written(&event), serde_json::to_string(&event).unwrap());
            }
        }
        let shared = AuditEvent {
            party: Party::Caller(Arc::new(Caller {
                tenant: "acme".into(),
                subject: tricky.into(),
                agent: "agent-7".into(),
                scopes: ["tools:read".to_owned()].into(),
                method: AuthMethod::Dev,
                claims: Default::default(),
                token: None,
                delegation: None,
            })),
            ..full.clone()
        };
        assert_eq!(written(&shared), written(&full));
        assert_eq!(written(&shared), serde_json::to_string(&shared).unwrap());
        let one_attempt = AuditEvent {
            bound_override_attempts: vec!["/a".into()],
            step: 0,
            ..AuditEvent::default()
        };
        assert_eq!(
            written(&one_attempt),
            serde_json::to_string(&one_attempt).unwrap()
        );
    }

    /// The line's format is the contract with whoever reads the log: time as RFC 3339 with
    /// milliseconds, the caller's names as three fields, ids in lowercase hex.
    #[test]
    fn the_line_keeps_its_format() {
        let event = AuditEvent {
            time: EventTime(1_796_119_200_123),
            kind: Some(EventKind::ToolCall),
            call_id: "c1".into(),
            run_id: "r1".into(),
            step: 2,
            party: Party::Caller(Arc::new(Caller {
                tenant: "acme".into(),
                subject: "alice".into(),
                agent: "support".into(),
                scopes: Default::default(),
                method: AuthMethod::Dev,
                claims: Default::default(),
                token: None,
                delegation: None,
            })),
            tool: "echo".into(),
            tool_version: "1.0.0".into(),
            status: "OK",
            duration_ms: 3,
            trace_id: Some(TraceId::from_bytes([
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36,
            ])),
            span_id: Some(SpanId::from_bytes([
                0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7,
            ])),
            ..AuditEvent::default()
        };
        assert_eq!(
            written(&event),
            concat!(
                r#"{"time":"2026-12-01T10:00:00.123Z","kind":"tool_call","call_id":"c1","run_id":"r1","step":2,"#,
                r#""tenant":"acme","subject":"alice","agent":"support","tool":"echo","tool_version":"1.0.0","#,
                r#""status":"OK","idempotent_replay":false,"duration_ms":3,"#,
                r#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}"#
            )
        );
    }
}
