//! Blocked time windows of a scenario (`"Mon-Fri 08:00-20:00 Europe/Berlin"`):
//! a drill against a real cluster refuses to start inside one. Pure: the
//! instant to check is passed in.

use jiff::civil::Weekday;
use jiff::tz::TimeZone;
use jiff::Timestamp;

/// Days, a local time range and the time zone they are read in.
#[derive(Clone, Debug)]
pub struct Window {
    pub text: String,
    days: [bool; 7],
    /// Minutes after local midnight; `end <= start` crosses midnight.
    start: u32,
    end: u32,
    tz: TimeZone,
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn day(s: &str) -> Result<usize, String> {
    DAYS.iter()
        .position(|d| s.eq_ignore_ascii_case(d))
        .ok_or_else(|| format!("`{s}` is not a day (Mon … Sun)"))
}

fn minutes(s: &str) -> Result<u32, String> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not HH:MM"))?;
    let (h, m): (u32, u32) = (
        h.parse().map_err(|_| format!("`{s}` is not HH:MM"))?,
        m.parse().map_err(|_| format!("`{s}` is not HH:MM"))?,
    );
    if h > 24 || m > 59 || (h == 24 && m > 0) {
        return Err(format!("`{s}` is not a time of day"));
    }
    Ok(h * 60 + m)
}

impl Window {
    /// Parses `DAYS HH:MM-HH:MM ZONE`; DAYS is `Mon-Fri`, `Sat,Sun`, `Mon`
    /// or `daily`; ZONE an IANA name (`Europe/Berlin`) or `UTC`.
    pub fn parse(text: &str) -> Result<Window, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [days_s, range, zone] = parts[..] else {
            return Err(format!(
                "`{text}` is not `DAYS HH:MM-HH:MM ZONE` (e.g. `Mon-Fri 08:00-20:00 Europe/Berlin`)"
            ));
        };
        let mut days = [false; 7];
        if days_s.eq_ignore_ascii_case("daily") {
            days = [true; 7];
        } else {
            for item in days_s.split(',') {
                match item.split_once('-') {
                    Some((a, b)) => {
                        let (a, b) = (day(a)?, day(b)?);
                        let mut d = a;
                        loop {
                            days[d] = true;
                            if d == b {
                                break;
                            }
                            d = (d + 1) % 7;
                        }
                    }
                    None => days[day(item)?] = true,
                }
            }
        }
        let (a, b) = range
            .split_once('-')
            .ok_or_else(|| format!("`{range}` is not HH:MM-HH:MM"))?;
        let tz = TimeZone::get(zone).map_err(|e| format!("`{zone}` is not a time zone ({e})"))?;
        Ok(Window {
            text: text.to_owned(),
            days,
            start: minutes(a)?,
            end: minutes(b)?,
            tz,
        })
    }

    /// Whether `now` falls inside the window.
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.tz.clone());
        let m = local.hour() as u32 * 60 + local.minute() as u32;
        let today = weekday_index(local.weekday());
        if self.start < self.end {
            self.days[today] && m >= self.start && m < self.end
        } else {
            // Crosses midnight: the evening part belongs to today, the
            // morning part to the day it started on.
            let yesterday = (today + 6) % 7;
            (self.days[today] && m >= self.start) || (self.days[yesterday] && m < self.end)
        }
    }
}

fn weekday_index(w: Weekday) -> usize {
    w.to_monday_zero_offset() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn office_hours_in_berlin() {
        let w = Window::parse("Mon-Fri 08:00-20:00 Europe/Berlin").unwrap();
        // Wednesday 2025-01-15: 07:30 UTC is 08:30 in Berlin (CET, +1).
        assert!(w.contains(at("2025-01-15T07:30:00Z")));
        assert!(!w.contains(at("2025-01-15T06:30:00Z")));
        assert!(!w.contains(at("2025-01-15T19:30:00Z")));
        // Saturday.
        assert!(!w.contains(at("2025-01-18T10:00:00Z")));
        // Summer time (CEST, +2): 06:30 UTC is 08:30 local.
        assert!(w.contains(at("2025-07-16T06:30:00Z")));
    }

    #[test]
    fn windows_cross_midnight_and_wrap_the_week() {
        let w = Window::parse("Fri-Mon 22:00-02:00 UTC").unwrap();
        assert!(w.contains(at("2025-01-17T23:00:00Z"))); // Fri night
        assert!(w.contains(at("2025-01-18T01:00:00Z"))); // early Sat, from Fri
        assert!(w.contains(at("2025-01-21T01:00:00Z"))); // early Tue, from Mon
        assert!(!w.contains(at("2025-01-22T01:00:00Z"))); // early Wed
        assert!(!w.contains(at("2025-01-17T12:00:00Z")));
    }

    #[test]
    fn bad_windows_say_why() {
        for (text, why) in [
            ("Mon-Fri 08:00-20:00", "not `DAYS"),
            ("Someday 08:00-20:00 UTC", "not a day"),
            ("daily 8-20 UTC", "not HH:MM"),
            ("daily 08:00-25:00 UTC", "not a time of day"),
            ("daily 08:00-20:00 Mars/Olympus", "not a time zone"),
        ] {
            let e = Window::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
