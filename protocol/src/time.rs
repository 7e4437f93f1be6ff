//! Timestamps as the protocol writes them: ISO-8601 UTC with exactly three fractional digits and
//! a `Z` suffix. Stored as milliseconds since the Unix epoch so comparisons and arithmetic are
//! cheap; formatting is done by hand to keep this crate free of a calendar dependency.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Milliseconds since the Unix epoch, rendered as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let millis = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
        };
        Self(millis)
    }

    /// From milliseconds since the Unix epoch.
    pub fn from_unix_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_millis(self) -> i64 {
        self.0
    }
}

// Howard Hinnant's days-from-civil / civil-from-days algorithms (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The calendar fields of a timestamp: year, month, day, hour, minute, second, millisecond.
fn fields(millis: i64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let (y, mo, d) = civil_from_days(millis.div_euclid(86_400_000));
    // Below 86,400,000: always fits.
    let ms_of_day = u32::try_from(millis.rem_euclid(86_400_000)).unwrap_or(0);
    let h = ms_of_day / 3_600_000;
    let mi = (ms_of_day / 60_000) % 60;
    let s = (ms_of_day / 1000) % 60;
    (y, mo, d, h, mi, s, ms_of_day % 1000)
}

/// The text form written into `buf` digit by digit (every event carries a timestamp, and
/// `core::fmt` costs several times as much); `None` for a year outside 0–9999, which
/// [`fmt::Display`] writes the general way.
fn render(millis: i64, buf: &mut [u8; 24]) -> Option<&str> {
    let (y, mo, d, h, mi, s, ms) = fields(millis);
    let year = u32::try_from(y).ok().filter(|y| *y <= 9999)?;
    *buf = *b"0000-00-00T00:00:00.000Z";
    // (start, width, value) of each field.
    for (start, width, mut value) in [
        (0, 4, year),
        (5, 2, mo),
        (8, 2, d),
        (11, 2, h),
        (14, 2, mi),
        (17, 2, s),
        (20, 3, ms),
    ] {
        for digit in buf[start..start + width].iter_mut().rev() {
            *digit = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    std::str::from_utf8(buf).ok()
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0; 24];
        if let Some(text) = render(self.0, &mut buf) {
            return f.write_str(text);
        }
        let (y, mo, d, h, mi, s, ms) = fields(self.0);
        write!(f, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }
}

parse_error! {
    /// The text is not an ISO-8601 UTC timestamp of the protocol's form.
    InvalidTimestamp = "timestamp is not ISO-8601 UTC";
    Timestamp => Timestamp::parse
}

impl Timestamp {
    /// Accepts `YYYY-MM-DDTHH:MM:SS[.fraction]Z` (fraction of any length, truncated to ms); also
    /// [`FromStr`](std::str::FromStr).
    fn parse(s: &str) -> Result<Self, InvalidTimestamp> {
        let b = s.as_bytes();
        if b.len() < 20 || b.last() != Some(&b'Z') {
            return Err(InvalidTimestamp);
        }
        let num = |r: std::ops::Range<usize>| -> Result<u32, InvalidTimestamp> {
            let part = b.get(r).ok_or(InvalidTimestamp)?;
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(InvalidTimestamp);
            }
            part.iter()
                .try_fold(0u32, |acc, c| {
                    acc.checked_mul(10)?.checked_add(u32::from(c - b'0'))
                })
                .ok_or(InvalidTimestamp)
        };
        let sep = |i: usize, c: u8| {
            if b.get(i) == Some(&c) {
                Ok(())
            } else {
                Err(InvalidTimestamp)
            }
        };
        let y = num(0..4)?;
        sep(4, b'-')?;
        let mo = num(5..7)?;
        sep(7, b'-')?;
        let d = num(8..10)?;
        if !matches!(b.get(10), Some(b'T' | b't')) {
            return Err(InvalidTimestamp);
        }
        let h = num(11..13)?;
        sep(13, b':')?;
        let mi = num(14..16)?;
        sep(16, b':')?;
        let sec = num(17..19)?;
        let mut ms = 0u32;
        let rest = &b[19..b.len() - 1];
        if !rest.is_empty() {
            if rest[0] != b'.' || rest.len() < 2 || !rest[1..].iter().all(u8::is_ascii_digit) {
                return Err(InvalidTimestamp);
            }
            for (i, c) in rest[1..].iter().take(3).enumerate() {
                ms += u32::from(c - b'0') * [100, 10, 1][i];
            }
        }
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
            return Err(InvalidTimestamp);
        }
        let days = days_from_civil(i64::from(y), mo, d);
        let millis = days * 86_400_000
            + i64::from(h) * 3_600_000
            + i64::from(mi) * 60_000
            + i64::from(sec) * 1000
            + i64::from(ms);
        Ok(Self(millis))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0; 24];
        match render(self.0, &mut buf) {
            Some(text) => serializer.serialize_str(text),
            None => serializer.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::parsed::deserialize(deserializer, "a timestamp", Timestamp::parse)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "ISO-8601 UTC time with milliseconds, e.g. 2026-01-01T00:00:00.000Z"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp(951_782_400_123).to_string(),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            Timestamp(1_798_761_599_999).to_string(),
            "2026-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "2026-01-01",
            "2026-01-01T00:00:00",
            "2026-13-01T00:00:00Z",
            "x026-01-01T00:00:00.000Z",
            "2026-01-01T00:00:00.Z",
        ] {
            assert!(bad.parse::<Timestamp>().is_err(), "{bad}");
        }
    }

    /// What [`fmt::Display`] wrote before it rendered digit by digit.
    fn general(millis: i64) -> String {
        let (y, mo, d, h, mi, s, ms) = fields(millis);
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }

    #[test]
    fn years_outside_four_digits_are_written_the_general_way() {
        for ms in [
            -62_167_219_200_001,
            253_402_300_800_000,
            i64::MIN / 2,
            i64::MAX / 2,
        ] {
            let mut buf = [0; 24];
            assert_eq!(render(ms, &mut buf), None);
            assert_eq!(Timestamp(ms).to_string(), general(ms));
        }
        let first = -62_167_219_200_000; // 0000-01-01T00:00:00.000Z
        assert_eq!(Timestamp(first).to_string(), "0000-01-01T00:00:00.000Z");
        assert_eq!(
            serde_json::to_string(&Timestamp(253_402_300_799_999)).unwrap(),
            "\"9999-12-31T23:59:59.999Z\""
        );
    }

    proptest! {
        #[test]
        fn digit_by_digit_writes_what_the_general_way_does(ms in -62_167_219_200_000i64..253_402_300_799_999) {
            let t = Timestamp(ms);
            prop_assert_eq!(t.to_string(), general(ms));
            prop_assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{}\"", general(ms)));
        }

        #[test]
        fn round_trips(ms in 0i64..253_402_300_799_999) {
            let t = Timestamp(ms);
            prop_assert_eq!(t.to_string().parse::<Timestamp>(), Ok(t));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(s in ".{0,40}") {
            let _ = s.parse::<Timestamp>();
        }
    }
}
