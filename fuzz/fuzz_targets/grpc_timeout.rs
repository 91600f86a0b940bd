//! The `grpc-timeout` header parser on arbitrary text: a client sets this header, so it must
//! never panic, and it accepts exactly what the gRPC spec allows — 1 to 8 ASCII digits and one
//! of the units H M S m u n — with the value those digits and that unit mean. A deadline computed
//! from any accepted value must not overflow either.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use toolgate::server::convert::grpc_timeout;

/// An independent reading of the spec, to compare with.
fn oracle(text: &str) -> Option<Duration> {
    let bytes = text.as_bytes();
    let (unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let nanos_per: u128 = match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => return None,
    };
    let nanos = u128::from(amount) * nanos_per;
    Some(Duration::new(
        u64::try_from(nanos / 1_000_000_000).ok()?,
        u32::try_from(nanos % 1_000_000_000).ok()?,
    ))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = grpc_timeout(text);
    assert_eq!(parsed, oracle(text), "{text:?}");
    if let Some(timeout) = parsed {
        // The deadline layer adds it to now with checked arithmetic; that must not panic.
        let _ = std::time::Instant::now().checked_add(timeout);
    }
});
