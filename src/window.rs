//! The maintenance window: the days and hours, in a time zone, when a node may start a
//! coordinated reboot ([`crate::reboot`]; `[reboot]` in the config). kured's `--reboot-days`, `--start-time`, `--end-time` and `--time-zone`,
//! with the same meaning: a window whose end is before its start runs past midnight and belongs
//! to the day it opened on.

use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

/// The accepted forms, for error messages.
pub const DAY_FORM: &str = "a weekday as mon, tue, wed, thu, fri, sat or sun (or the full name)";
/// The accepted form of a time of day.
pub const TIME_FORM: &str = "a time of day as HH:MM, such as \"22:00\"";
/// The accepted form of a time zone.
pub const ZONE_FORM: &str = "an IANA time zone name such as \"Europe/Berlin\", or \"UTC\"";

/// When reboots may start.
#[derive(Debug, Clone)]
pub struct Window {
    /// The days a window opens on, Monday first.
    days: [bool; 7],
    /// When it opens.
    start: Time,
    /// When it closes; equal to `start`: after a whole day.
    end: Time,
    /// The zone `start` and `end` are read in.
    zone: TimeZone,
    /// The zone's name as written.
    zone_name: String,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        (self.days, self.start, self.end, &self.zone_name)
            == (other.days, other.start, other.end, &other.zone_name)
    }
}

impl Default for Window {
    /// Every day, all day, in UTC: no window.
    fn default() -> Self {
        Self {
            days: [true; 7],
            start: Time::midnight(),
            end: Time::midnight(),
            zone: TimeZone::UTC,
            zone_name: "UTC".into(),
        }
    }
}

/// Parses one weekday name.
pub fn parse_day(s: &str) -> Result<Weekday, String> {
    let lower = s.trim().to_ascii_lowercase();
    let day = match lower.get(..3).unwrap_or_default() {
        "mon" => Weekday::Monday,
        "tue" => Weekday::Tuesday,
        "wed" => Weekday::Wednesday,
        "thu" => Weekday::Thursday,
        "fri" => Weekday::Friday,
        "sat" => Weekday::Saturday,
        "sun" => Weekday::Sunday,
        _ => return Err(format!("invalid day {s:?}: expected {DAY_FORM}")),
    };
    let full = day_name(day);
    if lower.len() == 3 || lower == full {
        Ok(day)
    } else {
        Err(format!("invalid day {s:?}: expected {DAY_FORM}"))
    }
}

fn day_name(d: Weekday) -> &'static str {
    match d {
        Weekday::Monday => "monday",
        Weekday::Tuesday => "tuesday",
        Weekday::Wednesday => "wednesday",
        Weekday::Thursday => "thursday",
        Weekday::Friday => "friday",
        Weekday::Saturday => "saturday",
        Weekday::Sunday => "sunday",
    }
}

/// Parses `HH:MM` (24-hour).
pub fn parse_time(s: &str) -> Result<Time, String> {
    let bad = || format!("invalid time {s:?}: expected {TIME_FORM}");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: i8 = h.parse().map_err(|_| bad())?;
    let m: i8 = m.parse().map_err(|_| bad())?;
    Time::new(h, m, 0, 0).map_err(|_| bad())
}

/// Looks a time zone up in the system's time zone database.
pub fn parse_zone(s: &str) -> Result<TimeZone, String> {
    if s == "UTC" {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(s).map_err(|e| format!("unknown time zone {s:?} ({e}): expected {ZONE_FORM}"))
}

impl Window {
    /// A window from its parts (already parsed).
    pub fn new(days: &[Weekday], start: Time, end: Time, zone: TimeZone, zone_name: &str) -> Self {
        let mut set = [false; 7];
        for d in days {
            set[usize::from(d.to_monday_zero_offset().unsigned_abs())] = true;
        }
        Self {
            days: set,
            start,
            end,
            zone,
            zone_name: zone_name.to_string(),
        }
    }

    fn on(&self, d: Weekday) -> bool {
        self.days[usize::from(d.to_monday_zero_offset().unsigned_abs())]
    }

    /// Every day, all day.
    pub fn always(&self) -> bool {
        self.days.iter().all(|d| *d) && self.start == self.end
    }

    /// Whether a reboot may start at `now`.
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        let (day, t) = (local.weekday(), local.time());
        if self.start == self.end {
            return self.on(day);
        }
        if self.start < self.end {
            return self.on(day) && self.start <= t && t < self.end;
        }
        // Past midnight: the part after midnight belongs to yesterday's window.
        (self.on(day) && t >= self.start) || (self.on(day.previous()) && t < self.end)
    }

    /// When the window next opens after `now` (`now` itself when open), within a week and a day;
    /// `None` when no day is on.
    pub fn next_open(&self, now: Timestamp) -> Option<Timestamp> {
        if self.contains(now) {
            return Some(now);
        }
        let local: Zoned = now.to_zoned(self.zone.clone());
        (0..=8).find_map(|i: i64| {
            let day = local.date().checked_add(i.days()).ok()?;
            let opens = day
                .to_datetime(self.start)
                .to_zoned(self.zone.clone())
                .ok()?;
            let at = opens.timestamp();
            (at > now && self.on(day.weekday())).then_some(at)
        })
    }

    /// For people: "mon,tue 22:00-04:00 Europe/Berlin", or "always".
    pub fn describe(&self) -> String {
        if self.always() {
            return "always".into();
        }
        let days: Vec<&str> = (0..7)
            .filter(|&i| self.days[i])
            .map(|i| DAY_ABBREV[i])
            .collect();
        format!(
            "{} {}-{} {}",
            days.join(","),
            self.start.strftime("%H:%M"),
            self.end.strftime("%H:%M"),
            self.zone_name
        )
    }
}

const DAY_ABBREV: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[&str], start: &str, end: &str, zone: &str) -> Window {
        let days: Vec<Weekday> = days.iter().map(|d| parse_day(d).unwrap()).collect();
        Window::new(
            &days,
            parse_time(start).unwrap(),
            parse_time(end).unwrap(),
            parse_zone(zone).unwrap(),
            zone,
        )
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_window_is_always_open() {
        let w = Window::default();
        assert!(w.always());
        assert!(w.contains(at("2026-11-28T03:00:00Z")));
        assert_eq!(w.describe(), "always");
    }

    /// (window, instant, open?) — 2026-11-27 is a Friday, 11-28 a Saturday.
    #[test]
    fn a_window_opens_on_its_days_and_hours_only() {
        let weekdays = ["mon", "tue", "wed", "thu", "fri"];
        let cases = [
            (
                window(&weekdays, "09:00", "17:00", "UTC"),
                "2026-11-27T10:00:00Z",
                true,
            ),
            (
                window(&weekdays, "09:00", "17:00", "UTC"),
                "2026-11-27T17:00:00Z",
                false,
            ),
            (
                window(&weekdays, "09:00", "17:00", "UTC"),
                "2026-11-27T08:59:59Z",
                false,
            ),
            (
                window(&weekdays, "09:00", "17:00", "UTC"),
                "2026-11-28T10:00:00Z",
                false,
            ),
            // Past midnight: Friday's window runs into Saturday morning...
            (
                window(&["fri"], "22:00", "04:00", "UTC"),
                "2026-11-28T03:00:00Z",
                true,
            ),
            (
                window(&["fri"], "22:00", "04:00", "UTC"),
                "2026-11-27T23:00:00Z",
                true,
            ),
            // ...but Saturday's own evening is not Friday's.
            (
                window(&["fri"], "22:00", "04:00", "UTC"),
                "2026-11-28T23:00:00Z",
                false,
            ),
            (
                window(&["fri"], "22:00", "04:00", "UTC"),
                "2026-11-27T03:00:00Z",
                false,
            ),
            // The hours are the zone's: 22:00 in Berlin (UTC+1 in November) is 21:00 UTC.
            (
                window(&["fri"], "22:00", "23:00", "Europe/Berlin"),
                "2026-11-27T21:30:00Z",
                true,
            ),
            (
                window(&["fri"], "22:00", "23:00", "Europe/Berlin"),
                "2026-11-27T22:30:00Z",
                false,
            ),
            // Equal start and end: the whole of each listed day.
            (
                window(&["sat"], "00:00", "00:00", "UTC"),
                "2026-11-28T23:59:00Z",
                true,
            ),
            (
                window(&["sat"], "00:00", "00:00", "UTC"),
                "2026-11-27T23:59:00Z",
                false,
            ),
        ];
        for (w, now, open) in cases {
            assert_eq!(w.contains(at(now)), open, "{} at {now}", w.describe());
        }
    }

    #[test]
    fn the_next_opening_is_found_across_days_and_zones() {
        let w = window(&["mon"], "02:00", "04:00", "Europe/Berlin");
        // Saturday 28th → Monday 30th 02:00 Berlin = 01:00 UTC.
        assert_eq!(
            w.next_open(at("2026-11-28T12:00:00Z")),
            Some(at("2026-11-30T01:00:00Z"))
        );
        let open = at("2026-11-30T01:30:00Z");
        assert_eq!(w.next_open(open), Some(open));
        let never = Window::new(
            &[],
            Time::midnight(),
            Time::midnight(),
            TimeZone::UTC,
            "UTC",
        );
        assert_eq!(never.next_open(open), None);
    }

    #[test]
    fn bad_parts_are_refused_with_the_expected_form() {
        for bad in ["funday", "mo", "mondays", ""] {
            let e = parse_day(bad).unwrap_err();
            assert!(e.contains("expected a weekday"), "{bad}: {e}");
        }
        assert_eq!(parse_day("Thursday"), Ok(Weekday::Thursday));
        for bad in ["25:00", "9:00", "09:60", "0900", "09:00:00"] {
            let e = parse_time(bad).unwrap_err();
            assert!(e.contains("HH:MM"), "{bad}: {e}");
        }
        let e = parse_zone("Mars/Olympus").unwrap_err();
        assert!(e.contains("IANA"), "{e}");
        assert_eq!(
            window(&["mon", "fri"], "22:00", "04:00", "UTC").describe(),
            "mon,fri 22:00-04:00 UTC"
        );
    }
}
