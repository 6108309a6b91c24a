//! Numbers as `top` prints them: pure functions, "n/a" for an absent value (never 0).

/// What an absent value prints as.
pub const NA: &str = "n/a";

/// Eighth-block characters, empty to full: one cell of a per-GPU bar.
const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// One cell showing `frac` (0..=1) as a vertical eighth block; `·` when absent.
pub fn block(frac: Option<f64>) -> char {
    match frac {
        None => '·',
        Some(f) if !f.is_finite() => '·',
        Some(f) => {
            let i = (f.clamp(0.0, 1.0) * 8.0).round() as usize;
            // A non-zero value always shows, so a busy-but-low GPU is not mistaken for idle.
            let i = if f > 0.0 && i == 0 { 1 } else { i };
            BLOCKS.get(i).copied().unwrap_or('█')
        }
    }
}

/// A horizontal bar of `width` cells for `frac` (0..=1), htop-like: `|||||     `.
pub fn bar(frac: Option<f64>, width: usize) -> String {
    match frac {
        None => format!("{NA:<width$}"),
        Some(f) => {
            let f = if f.is_finite() {
                f.clamp(0.0, 1.0)
            } else {
                0.0
            };
            let full = (f * width as f64).round() as usize;
            let full = full.min(width);
            format!("{}{}", "|".repeat(full), " ".repeat(width - full))
        }
    }
}

/// A fraction `a / b`, when both are present and `b` is not zero.
pub fn frac(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// `45%`, or n/a.
pub fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| NA.to_owned(), |v| format!("{v:.0}%"))
}

/// Bytes in binary units: `79.6G`, `512M`, `0B`.
pub fn bytes(v: Option<u64>) -> String {
    let Some(b) = v else {
        return NA.to_owned();
    };
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut x = b as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    let u = UNITS.get(unit).copied().unwrap_or("?");
    if unit == 0 || x >= 100.0 {
        format!("{x:.0}{u}")
    } else {
        format!("{x:.1}{u}")
    }
}

/// Milliwatts as watts (`350W`) or kilowatts past 10 kW (`52.3kW`).
pub fn watts_mw(v: Option<f64>) -> String {
    match v {
        None => NA.to_owned(),
        Some(mw) if mw >= 10_000_000.0 => format!("{:.1}kW", mw / 1e6),
        Some(mw) => format!("{:.0}W", mw / 1000.0),
    }
}

/// `65C`, or n/a.
pub fn celsius(v: Option<u32>) -> String {
    v.map_or_else(|| NA.to_owned(), |c| format!("{c}C"))
}

/// Joules as `Wh` / `kWh` / `MWh`.
pub fn energy_j(j: f64) -> String {
    let kwh = j / 3.6e6;
    if kwh >= 1000.0 {
        format!("{:.2} MWh", kwh / 1000.0)
    } else if kwh >= 1.0 {
        format!("{kwh:.2} kWh")
    } else {
        format!("{:.1} Wh", j / 3600.0)
    }
}

/// Grams of CO2 as `g` / `kg` / `t`; n/a without a price.
pub fn carbon_g(g: Option<f64>) -> String {
    match g {
        None => NA.to_owned(),
        Some(g) if g >= 1e6 => format!("{:.2} t", g / 1e6),
        Some(g) if g >= 1000.0 => format!("{:.2} kg", g / 1000.0),
        Some(g) => format!("{g:.0} g"),
    }
}

/// How long ago `then_ms` was at `now_ms`: `3s`, `5m`, `2h`, `4d`; `never` when absent.
pub fn ago(then_ms: Option<i64>, now_ms: i64) -> String {
    let Some(t) = then_ms else {
        return "never".to_owned();
    };
    let s = (now_ms.saturating_sub(t) / 1000).max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `text` cut to `width` characters (an ellipsis marks the cut), padded to it.
pub fn fit(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        format!("{text:<width$}")
    } else if width == 0 {
        String::new()
    } else {
        let mut s: String = text.chars().take(width - 1).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_is_not_zero() {
        assert_eq!(block(None), '·');
        assert_eq!(block(Some(0.0)), ' ');
        assert_eq!(pct(None), "n/a");
        assert_eq!(bytes(None), "n/a");
        assert_eq!(watts_mw(None), "n/a");
        assert_eq!(celsius(None), "n/a");
        assert_eq!(carbon_g(None), "n/a");
        assert_eq!(bar(None, 5), "n/a  ");
        assert_eq!(frac(Some(1.0), Some(0.0)), None);
        assert_eq!(frac(None, Some(2.0)), None);
    }

    #[test]
    fn blocks_and_bars() {
        assert_eq!(block(Some(1.0)), '█');
        assert_eq!(block(Some(0.01)), '▁', "a non-zero value shows");
        assert_eq!(block(Some(7.0)), '█', "clamped");
        assert_eq!(bar(Some(0.5), 10), "|||||     ");
        assert_eq!(bar(Some(2.0), 4), "||||");
    }

    #[test]
    fn units() {
        assert_eq!(bytes(Some(0)), "0B");
        assert_eq!(bytes(Some(80 * 1024 * 1024 * 1024)), "80.0G");
        assert_eq!(bytes(Some(512 * 1024 * 1024)), "512M");
        assert_eq!(watts_mw(Some(350_000.0)), "350W");
        assert_eq!(watts_mw(Some(52_300_000.0)), "52.3kW");
        assert_eq!(energy_j(3.6e6), "1.00 kWh");
        assert_eq!(energy_j(7200.0), "2.0 Wh");
        assert_eq!(carbon_g(Some(1500.0)), "1.50 kg");
        assert_eq!(ago(Some(0), 125_000), "2m");
        assert_eq!(ago(None, 5), "never");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("ab", 4), "ab  ");
    }
}
