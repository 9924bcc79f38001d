//! Python's `strftime` directives, for `strftime_now`.

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `t.strftime(format)` as CPython on glibc computes it for a naive datetime: Python itself
/// expands `%f` and empties `%z`/`%Z` (no time zone), glibc does the rest in the C locale,
/// including the flags `-` (no padding), `_` (spaces), `0` (zeros), `^` (upper case), `#` (swap
/// case) and a field width. An unknown directive is copied as it is.
pub(super) fn strftime(t: &jiff::civil::DateTime, format: &str) -> String {
    let mut out = String::new();
    let mut rest = format;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let spec = &rest[at..];
        let (consumed, text) = directive(t, spec);
        out.push_str(&text);
        rest = &spec[consumed..];
    }
    out.push_str(rest);
    out
}

/// One directive at the start of `spec` (which starts with `%`): how many bytes it spans and what
/// it prints.
fn directive(t: &jiff::civil::DateTime, spec: &str) -> (usize, String) {
    let bytes = spec.as_bytes();
    let mut i = 1;
    let mut pad: Option<char> = None;
    let mut no_pad = false;
    let mut upper = false;
    let mut swap_case = false;
    while let Some(&flag) = bytes.get(i) {
        match flag {
            b'-' => no_pad = true,
            b'_' => (pad, no_pad) = (Some(' '), false),
            b'0' => (pad, no_pad) = (Some('0'), false),
            b'^' => upper = true,
            b'#' => swap_case = true,
            _ => break,
        }
        i += 1;
    }
    let width_start = i;
    while bytes.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    let width: usize = spec[width_start..i].parse().unwrap_or(0);
    // The C locale ignores the E and O modifiers.
    while matches!(bytes.get(i), Some(b'E' | b'O')) && bytes.get(i + 1).is_some() {
        i += 1;
    }
    let Some(conversion) = spec[i..].chars().next() else {
        return (spec.len(), spec.to_owned());
    };
    let end = i + conversion.len_utf8();
    let plain = end == 2;
    let weekday = t.weekday().to_sunday_zero_offset() as usize;
    let yday = t.day_of_year() as i64 - 1;
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h as i64,
    };
    let iso = t.date().iso_week_date();
    // (digits, default padding, default width) or text.
    enum Field {
        Number(i64, char, usize),
        Text(String),
    }
    let field = match conversion {
        'a' => Field::Text(WEEKDAYS[weekday][..3].to_owned()),
        'A' => Field::Text(WEEKDAYS[weekday].to_owned()),
        'b' | 'h' => Field::Text(MONTHS[t.month() as usize - 1][..3].to_owned()),
        'B' => Field::Text(MONTHS[t.month() as usize - 1].to_owned()),
        'c' => Field::Text(strftime(t, "%a %b %e %H:%M:%S %Y")),
        'C' => Field::Number(t.year() as i64 / 100, '0', 2),
        'd' => Field::Number(t.day() as i64, '0', 2),
        'D' | 'x' => Field::Text(strftime(t, "%m/%d/%y")),
        'e' => Field::Number(t.day() as i64, ' ', 2),
        'F' => Field::Text(strftime(t, "%Y-%m-%d")),
        'g' => Field::Number((iso.year() as i64).rem_euclid(100), '0', 2),
        'G' => Field::Number(iso.year() as i64, '0', 1),
        'H' => Field::Number(t.hour() as i64, '0', 2),
        'I' => Field::Number(hour12, '0', 2),
        'j' => Field::Number(yday + 1, '0', 3),
        'k' => Field::Number(t.hour() as i64, ' ', 2),
        'l' => Field::Number(hour12, ' ', 2),
        'm' => Field::Number(t.month() as i64, '0', 2),
        'M' => Field::Number(t.minute() as i64, '0', 2),
        'n' => Field::Text("\n".to_owned()),
        'p' | 'P' => {
            let am_pm = if t.hour() < 12 { "AM" } else { "PM" };
            let lower = conversion == 'P' || swap_case;
            Field::Text(if lower {
                am_pm.to_lowercase()
            } else {
                am_pm.to_owned()
            })
        }
        'r' => Field::Text(strftime(t, "%I:%M:%S %p")),
        'R' => Field::Text(strftime(t, "%H:%M")),
        's' => match t.to_zoned(jiff::tz::TimeZone::system()) {
            Ok(zoned) => Field::Number(zoned.timestamp().as_second(), '0', 1),
            Err(_) => Field::Text(spec[..end].to_owned()),
        },
        'S' => Field::Number(t.second() as i64, '0', 2),
        't' => Field::Text("\t".to_owned()),
        'T' | 'X' => Field::Text(strftime(t, "%H:%M:%S")),
        'u' => Field::Number(t.weekday().to_monday_one_offset() as i64, '0', 1),
        'U' => Field::Number((yday + 7 - weekday as i64) / 7, '0', 2),
        'V' => Field::Number(iso.week() as i64, '0', 2),
        'w' => Field::Number(weekday as i64, '0', 1),
        'W' => Field::Number((yday + 7 - (weekday as i64 + 6) % 7) / 7, '0', 2),
        'y' => Field::Number((t.year() as i64).rem_euclid(100), '0', 2),
        'Y' => Field::Number(t.year() as i64, '0', 1),
        // Python's own: no time zone on a naive datetime, and microseconds (only as plain `%f`).
        'z' | 'Z' => Field::Text(String::new()),
        'f' if plain => Field::Text(format!("{:06}", t.subsec_nanosecond() / 1000)),
        '%' if plain => Field::Text("%".to_owned()),
        _ => Field::Text(spec[..end].to_owned()),
    };
    let text = match field {
        Field::Number(n, default_pad, default_width) => {
            let digits = n.abs().to_string();
            let sign = if n < 0 { "-" } else { "" };
            let width = if no_pad { 0 } else { width.max(default_width) };
            let fill = pad.unwrap_or(default_pad);
            let len = sign.len() + digits.len();
            let padding: String = std::iter::repeat_n(fill, width.saturating_sub(len)).collect();
            if fill == '0' {
                format!("{sign}{padding}{digits}")
            } else {
                format!("{padding}{sign}{digits}")
            }
        }
        Field::Text(text) => {
            let text = if upper || (swap_case && matches!(conversion, 'a' | 'A' | 'b' | 'B' | 'h'))
            {
                text.to_uppercase()
            } else {
                text
            };
            let fill = pad.unwrap_or(' ');
            let padding: String =
                std::iter::repeat_n(fill, width.saturating_sub(text.chars().count())).collect();
            format!("{padding}{text}")
        }
    };
    (end, text)
}
