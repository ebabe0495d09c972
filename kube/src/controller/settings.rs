//! Reading kube-runtime's `Action` and `controller::Config`.
//!
//! Both keep their fields private and offer no getters, yet a drop-in
//! controller must take them as they are: reconcilers return kube-runtime's
//! `Action`, and `with_config` takes kube-runtime's `Config`. Their `Debug`
//! output is the only public view of the fields, so it is read here, and
//! every reading of an `Action` is checked by rebuilding the `Action` and
//! comparing it with the original (both types implement `PartialEq` or have
//! public constructors). A reading that fails is reported, never guessed:
//! the tests beside this code pin the format for every kind of duration.

use std::time::Duration;

use kube_runtime::controller::{Action, Config};

/// `Action::requeue(d)` gives `Ok(Some(d))`, `Action::await_change()`
/// `Ok(None)`; `Err` carries the `Debug` text that could not be read.
pub(crate) fn requeue_after(action: &Action) -> Result<Option<Duration>, String> {
    if *action == Action::await_change() {
        return Ok(None);
    }
    let text = format!("{action:?}");
    let read = field(&text, "requeue_after")
        .and_then(|v| v.strip_prefix("Some(")?.strip_suffix(')'))
        .and_then(parse_duration);
    match read {
        Some(d) if Action::requeue(d) == *action => Ok(Some(d)),
        _ => Err(text),
    }
}

/// The debounce and concurrency of a kube-runtime `Config`, or the `Debug`
/// text that could not be read.
pub(crate) fn config_parts(config: &Config) -> Result<(Duration, u16), String> {
    let text = format!("{config:?}");
    let debounce = field(&text, "debounce").and_then(parse_duration);
    let concurrency = field(&text, "concurrency").and_then(|v| v.parse().ok());
    match (debounce, concurrency) {
        (Some(d), Some(c)) => Ok((d, c)),
        _ => Err(text),
    }
}

/// The value of `name` in a derived `Debug` struct text.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("{name}: "))? + name.len() + 2;
    let rest = &text[start..];
    // Values here hold no commas or braces (durations, integers, Options).
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// Reads `Duration`'s `Debug` form: `1.5s`, `250ms`, `3µs`, `7ns`, printed
/// with every significant digit (no rounding without a precision).
fn parse_duration(text: &str) -> Option<Duration> {
    let (number, nanos_per_unit) = if let Some(n) = text.strip_suffix("ns") {
        (n, 1u64)
    } else if let Some(n) = text.strip_suffix("µs") {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000_000_000)
    } else {
        return None;
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (number, ""),
    };
    let digits = nanos_per_unit.ilog10() as usize;
    if fraction.len() > digits || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let fraction_nanos: u64 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<digits$}").parse().ok()?
    };
    if nanos_per_unit == 1_000_000_000 {
        Some(Duration::new(whole, u32::try_from(fraction_nanos).ok()?))
    } else {
        let nanos = whole
            .checked_mul(nanos_per_unit)?
            .checked_add(fraction_nanos)?;
        Some(Duration::from_nanos(nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn await_change_reads_as_none() {
        assert_eq!(requeue_after(&Action::await_change()), Ok(None));
    }

    #[test]
    fn each_unit_reads_back() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(7),
            Duration::from_nanos(1_500),
            Duration::from_micros(999),
            Duration::from_millis(250),
            Duration::from_nanos(1_000_001),
            Duration::from_secs(300),
            Duration::new(1, 1),
            Duration::MAX,
        ] {
            assert_eq!(requeue_after(&Action::requeue(d)), Ok(Some(d)), "{d:?}");
        }
    }

    #[test]
    fn config_reads_back() {
        let config = Config::default()
            .concurrency(7)
            .debounce(Duration::from_millis(1500));
        assert_eq!(config_parts(&config), Ok((Duration::from_millis(1500), 7)));
        assert_eq!(config_parts(&Config::default()), Ok((Duration::ZERO, 0)));
    }

    #[test]
    fn nonsense_is_refused() {
        for text in [
            "",
            "s",
            "1.s",
            "1.0000000001s",
            "abc",
            "1x",
            "-1s",
            "1.-5ms",
        ] {
            assert_eq!(parse_duration(text), None, "{text}");
        }
    }

    proptest! {
        #[test]
        fn any_duration_reads_back(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(requeue_after(&Action::requeue(d)), Ok(Some(d)));
        }

        #[test]
        fn any_short_duration_reads_back(nanos in 0u64..10_000_000_000) {
            let d = Duration::from_nanos(nanos);
            prop_assert_eq!(requeue_after(&Action::requeue(d)), Ok(Some(d)));
        }
    }
}
