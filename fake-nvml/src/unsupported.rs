//! A GPU's `unsupported` list (scenario strings), resolved once when the scenario loads:
//! a call then tests a flag or scans a short list of numbers instead of comparing (or
//! formatting) strings.

use crate::function::Function;

/// What one GPU answers `NVML_ERROR_NOT_SUPPORTED` for. Matches exactly the entries the
/// string forms in [`crate::Gpu::unsupported`] name; an entry of no known form (or a number
/// not written as NVML's decimal, e.g. `field:0186`) matches nothing, as before.
#[derive(Debug, Clone)]
pub struct Unsupported {
    /// By [`Function`]: the whole function (`nvmlDeviceGetFanSpeed_v2`).
    functions: [bool; Function::COUNT],
    /// `nvmlDeviceGetTotalEccErrors:aggregate`: the lifetime ECC counts only.
    pub ecc_aggregate: bool,
    /// `field:<id>` (scope `None`: every scope) and `field:<id>:<scopeId>`.
    fields: Vec<(u32, Option<u32>)>,
    /// `nvmlDeviceGetNvLinkErrorCounter:<counter>` (link `None`: every link) and
    /// `…:<counter>:<link>`.
    nvlink_errors: Vec<(String, Option<u32>)>,
}

impl Unsupported {
    pub fn new(entries: &[String]) -> Self {
        let mut u = Self {
            functions: [false; Function::COUNT],
            ecc_aggregate: false,
            fields: Vec::new(),
            nvlink_errors: Vec::new(),
        };
        for e in entries {
            if let Some(f) = Function::from_name(e) {
                u.functions[f as usize] = true;
            } else if e == "nvmlDeviceGetTotalEccErrors:aggregate" {
                u.ecc_aggregate = true;
            } else if let Some(rest) = e.strip_prefix("field:") {
                if let Some(field) = number_and_scope(rest, decimal) {
                    u.fields.push(field);
                }
            } else if let Some(rest) = e.strip_prefix("nvmlDeviceGetNvLinkErrorCounter:")
                && let Some(counter) = number_and_scope(rest, |s| Some(s.to_owned()))
            {
                u.nvlink_errors.push(counter);
            }
        }
        u
    }

    /// Whether the whole function answers NOT_SUPPORTED.
    pub fn function(&self, f: Function) -> bool {
        self.functions[f as usize]
    }

    /// Whether field `id` answers NOT_SUPPORTED for scope `scope`.
    pub fn field(&self, id: u32, scope: u32) -> bool {
        self.fields
            .iter()
            .any(|&(f, s)| f == id && s.is_none_or(|s| s == scope))
    }

    /// Whether NVLink error counter `counter` (`crc_flit`, …) answers NOT_SUPPORTED on
    /// link `link`.
    pub fn nvlink_error(&self, counter: &str, link: u32) -> bool {
        self.nvlink_errors
            .iter()
            .any(|(c, l)| c == counter && l.is_none_or(|l| l == link))
    }
}

/// `<what>` or `<what>:<n>` (the scope or link `n` in decimal).
fn number_and_scope<T>(s: &str, what: impl Fn(&str) -> Option<T>) -> Option<(T, Option<u32>)> {
    match s.split_once(':') {
        None => Some((what(s)?, None)),
        Some((w, n)) => Some((what(w)?, Some(decimal(n)?))),
    }
}

/// A `u32` written as `format!("{n}")` writes it (what the old string compare matched).
pub(crate) fn decimal(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|n| n.to_string() == s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(entries: &[&str]) -> Unsupported {
        Unsupported::new(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn functions_and_the_ecc_aggregate() {
        let u = of(&[
            "nvmlDeviceGetFanSpeed_v2",
            "nvmlDeviceGetTotalEccErrors:aggregate",
        ]);
        assert!(u.function(Function::nvmlDeviceGetFanSpeed_v2));
        assert!(!u.function(Function::nvmlDeviceGetTotalEccErrors));
        assert!(u.ecc_aggregate);
        assert!(!of(&[]).ecc_aggregate);
    }

    #[test]
    fn fields_by_id_or_by_scope() {
        let u = of(&[
            "field:186",
            "field:138:2",
            "field:0082",
            "field:139:+1",
            "field:",
        ]);
        assert!(u.field(186, 0) && u.field(186, u32::MAX));
        assert!(u.field(138, 2) && !u.field(138, 3) && !u.field(138, u32::MAX));
        // Not NVML's decimal: never named a field, so matches nothing.
        assert!(!u.field(82, 0) && !u.field(139, 1));
    }

    #[test]
    fn nvlink_error_counters_by_counter_or_by_link() {
        let u = of(&[
            "nvmlDeviceGetNvLinkErrorCounter:crc_data",
            "nvmlDeviceGetNvLinkErrorCounter:replay:1",
            "nvmlDeviceGetNvLinkErrorCounter:recovery:01",
        ]);
        assert!(u.nvlink_error("crc_data", 0) && u.nvlink_error("crc_data", 17));
        assert!(u.nvlink_error("replay", 1) && !u.nvlink_error("replay", 0));
        assert!(!u.nvlink_error("recovery", 1) && !u.nvlink_error("crc_flit", 0));
        assert!(!u.function(Function::nvmlDeviceGetNvLinkErrorCounter));
    }
}
