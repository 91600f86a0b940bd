//! An audit event's JSON line, written field by field: byte for byte what serde_json makes of the
//! derived `Serialize` (the tests compare the two), at a fraction of the cost. serde_json looks
//! at every byte of every string through a table, and `#[serde(flatten)]` turns the event into a
//! map of ~20 entries, each a trip through the serializer; this was the audit writer thread's
//! whole cost (docs/performance.md). Shadow decisions (flattened records) take serde's path.

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
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        if self.shadow.is_some() {
            return serde_json::to_writer(out, self);
        }
        let mut object = Object::start(out);
        object.string(key!("time"), &self.time);
        match self.kind {
            Some(kind) => object.string(key!("kind"), kind.as_str()),
            None => object.raw(key!("kind"), b"null"),
        }
        object.string(key!("call_id"), &self.call_id);
        object.string(key!("run_id"), &self.run_id);
        object.number(key!("step"), u64::from(self.step));
        object.string(key!("tenant"), &self.tenant);
        object.string(key!("subject"), &self.subject);
        object.string(key!("agent"), &self.agent);
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
        if !self.bound_override_attempts.is_empty() {
            let out = object.key(key!("bound_override_attempts"));
            out.push(b'[');
            for (i, path) in self.bound_override_attempts.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(path, out);
            }
            out.push(b']');
        }
        object.number(key!("duration_ms"), self.duration_ms);
        object.optional_string(key!("trace_id"), self.trace_id.as_deref());
        object.optional_string(key!("span_id"), self.span_id.as_deref());
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
    use super::*;

    fn written(event: &AuditEvent) -> String {
        let mut out = Vec::new();
        event.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_field_is_written_as_serde_json_writes_it() {
        let tricky = "line\nbreak \"quoted\" \\ tab\t \u{1} é 漢字 \u{7f}";
        let full = AuditEvent {
            time: "2026-12-01T10:00:00.123Z".into(),
            kind: Some(EventKind::ApprovalDecision),
            call_id: tricky.into(),
            run_id: "run-1".into(),
            step: u32::MAX,
            tenant: "acme".into(),
            subject: tricky.into(),
            agent: "agent-7".into(),
            tool: "rag_search".into(),
            tool_version: "2.1.0".into(),
            risk_level: Some("read_only"),
            arguments_sha256: Some("ab".repeat(32)),
            status: "REFUSED",
            error_type: Some("schema_invalid"),
            refused_by: Some("schema"),
            reason: Some(tricky.into()),
            approval_id: Some("ap-1".into()),
            approver: Some("ops@example.com".into()),
            idempotent_replay: true,
            bound_override_attempts: vec!["/tenant".into(), tricky.into()],
            duration_ms: u64::MAX,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
            span_id: Some("00f067aa0ba902b7".into()),
            arguments: Some(serde_json::json!({"q": tricky, "n": [1, 2.5, null, true]})),
            rpc: Some("/toolgate.v1.ToolGate/ExecuteTool".into()),
            peer: Some("127.0.0.1:5000".into()),
            suppressed: Some(0),
            shadow: None,
        };
        let kinds = [
            None,
            Some(EventKind::ToolCall),
            Some(EventKind::ApprovalDecision),
            Some(EventKind::AuthenticationFailed),
            Some(EventKind::ShadowDecision),
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
}
