//! [`IdScanner`]: follows a JSON-RPC message a byte at a time, without keeping it, far enough to
//! learn its top-level `id`; the stdio framing uses it to answer a message too large to keep.

use rmcp::model::RequestId;
use serde_json::Value;

/// Follows one JSON-RPC message, a byte at a time and without keeping it, far enough to know its
/// top-level `id` and whether it has a `method` (a request or notification from the server,
/// whose id is not one of ours).
#[derive(Default)]
pub struct IdScanner {
    state: ScanState,
    depth: u32,
    in_string: bool,
    escaped: bool,
    key: Vec<u8>,
    value_of: ValueOf,
    id: Vec<u8>,
    id_complete: bool,
    has_method: bool,
}

#[derive(Default, PartialEq, Eq)]
enum ScanState {
    #[default]
    Start,
    ExpectKey,
    InKey,
    AfterKey,
    Value,
    Done,
    Broken,
}

#[derive(Default, PartialEq, Eq)]
enum ValueOf {
    #[default]
    Other,
    Id,
}

/// The longest `id` text kept; JSON-RPC ids are short numbers or strings.
const MAX_ID_BYTES: usize = 256;

impl IdScanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        let space = matches!(b, b' ' | b'\t' | b'\r' | b'\n');
        match self.state {
            ScanState::Done | ScanState::Broken => {}
            ScanState::Start => match b {
                b'{' => {
                    self.depth = 1;
                    self.state = ScanState::ExpectKey;
                }
                _ if space => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::ExpectKey => match b {
                b'"' => {
                    self.key.clear();
                    self.escaped = false;
                    self.state = ScanState::InKey;
                }
                b'}' => self.state = ScanState::Done,
                _ if space || b == b',' => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::InKey => {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.state = ScanState::AfterKey;
                    return;
                }
                if self.key.len() < 16 {
                    self.key.push(b);
                }
            }
            ScanState::AfterKey => match b {
                b':' => {
                    self.value_of = ValueOf::Other;
                    match self.key.as_slice() {
                        b"id" => {
                            self.value_of = ValueOf::Id;
                            self.id.clear();
                            self.id_complete = false;
                        }
                        b"method" => self.has_method = true,
                        _ => {}
                    }
                    self.in_string = false;
                    self.escaped = false;
                    self.state = ScanState::Value;
                }
                _ if space => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::Value => {
                if self.in_string {
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        self.in_string = false;
                    }
                } else {
                    match b {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' if self.depth > 1 => self.depth -= 1,
                        b'}' if self.depth == 1 => {
                            self.end_value();
                            self.state = ScanState::Done;
                            return;
                        }
                        b',' if self.depth == 1 => {
                            self.end_value();
                            self.state = ScanState::ExpectKey;
                            return;
                        }
                        b']' => {
                            self.state = ScanState::Broken;
                            return;
                        }
                        _ => {}
                    }
                }
                if self.value_of == ValueOf::Id {
                    if self.id.len() < MAX_ID_BYTES {
                        self.id.push(b);
                    } else {
                        self.value_of = ValueOf::Other;
                        self.id.clear();
                    }
                }
            }
        }
    }

    fn end_value(&mut self) {
        if self.value_of == ValueOf::Id {
            self.id_complete = true;
        }
        self.value_of = ValueOf::Other;
    }

    /// The id of a response (a message with an `id` and no `method`), if it was seen whole.
    pub fn response_id(&self) -> Option<RequestId> {
        if self.has_method || !self.id_complete {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.id).ok()? {
            id @ (Value::Number(_) | Value::String(_)) => serde_json::from_value(id).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(message: &str) -> Option<RequestId> {
        let mut scanner = IdScanner::default();
        scanner.feed(message.as_bytes());
        scanner.response_id()
    }

    #[test]
    fn the_scanner_finds_top_level_ids_anywhere_in_a_response() {
        let number: Option<RequestId> = serde_json::from_value(serde_json::json!(7)).ok();
        let text: Option<RequestId> = serde_json::from_value(serde_json::json!("a,b}")).ok();
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#),
            number
        );
        // After the result, with nested ids, strings with braces and escapes in the way.
        assert_eq!(
            id_of(
                r#"{"result":{"id":99,"t":"}\"{,[","a":[{"id":1}]}, "jsonrpc":"2.0" , "id" : 7 }"#
            ),
            number
        );
        assert_eq!(id_of(r#"{"id":"a,b}","result":{}}"#), text);
        // Requests and notifications from the server carry ids of their own numbering.
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage"}"#),
            None
        );
        assert_eq!(id_of(r#"{"method":"x","id":7}"#), None);
        // Cut off before the id was complete, or no object at all.
        assert_eq!(id_of(r#"{"result":"xxxx"#), None);
        assert_eq!(id_of(r#"{"id":12"#), None);
        assert_eq!(id_of("[1,2]"), None);
        assert_eq!(id_of(r#"{"id":{"no":1},"result":0}"#), None);
    }
}
