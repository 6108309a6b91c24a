//! The cost model (`Scenario::cost_model` and `Scenario::costs`), resolved once when the
//! scenario loads: a call then reads its cost from an array slot indexed by [`Function`]
//! (and a field-value entry from a short list of ids), never from the string-keyed map.

use crate::function::Function;
use crate::unsupported::decimal;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What one call costs, paid after the call's work with the fake's lock released (so
/// calls on several threads overlap, as on a real driver): the thread spins until its
/// own CPU time (`CLOCK_THREAD_CPUTIME_ID`) has advanced by `cpu_us`, then sleeps
/// `wait_us`. Charged also when the call answers NOT_SUPPORTED or NOT_FOUND (the driver
/// did the work), not for a bad handle nor a lost GPU. The totals per GPU are in the
/// counts file as `gpu<i>.charged_cpu_us` / `gpu<i>.charged_wait_us`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallCost {
    /// CPU time to burn on the calling thread (µs).
    pub cpu_us: u64,
    /// Time to sleep after it (µs): the driver waiting on the GPU.
    pub wait_us: u64,
}

impl CallCost {
    /// Nothing to pay.
    pub const FREE: Self = Self {
        cpu_us: 0,
        wait_us: 0,
    };

    /// A cost of CPU only.
    pub const fn cpu(cpu_us: u64) -> Self {
        Self { cpu_us, wait_us: 0 }
    }

    /// Whether there is nothing to pay.
    pub const fn is_free(self) -> bool {
        self.cpu_us == 0 && self.wait_us == 0
    }

    /// Both costs added (saturating).
    #[must_use]
    pub const fn plus(self, other: Self) -> Self {
        Self {
            cpu_us: self.cpu_us.saturating_add(other.cpu_us),
            wait_us: self.wait_us.saturating_add(other.wait_us),
        }
    }
}

/// The presets `cost_model` may name.
pub const PRESETS: &[&str] = &["h200"];

/// `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION`.
const FI_TOTAL_ENERGY_CONSUMPTION: u32 = 83;
/// `NVML_FI_DEV_ENERGY`.
const FI_ENERGY: u32 = 191;
/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `_RX_BYTES` (newer than the bindings' constants).
const FI_PCIE_COUNT_TX_BYTES: u32 = 197;
const FI_PCIE_COUNT_RX_BYTES: u32 = 198;

/// What each call and each field-value entry costs.
#[derive(Debug, Clone)]
pub struct Costs {
    /// By [`Function`]. System functions are never charged (only per-device calls pay).
    functions: [CallCost; Function::COUNT],
    /// Field-value entries with a cost of their own: (field id, cost per entry).
    fields: Vec<(u32, CallCost)>,
    /// Any other field-value entry.
    other_fields: CallCost,
}

impl Costs {
    /// Resolves a scenario's preset and overrides. `Ok(None)` when it has neither (calls
    /// cost nothing and pay nothing); an error names an unknown preset or a key that names
    /// no per-device function and no `field:<id>`.
    pub fn new(
        model: Option<&str>,
        overrides: &BTreeMap<String, CallCost>,
    ) -> Result<Option<Self>, String> {
        let mut costs = match model {
            None if overrides.is_empty() => return Ok(None),
            None => Self::free(),
            Some("h200") => Self::h200(),
            Some(other) => {
                return Err(format!(
                    "unknown cost_model {other:?} (known: {})",
                    PRESETS.join(", ")
                ));
            }
        };
        for (key, cost) in overrides {
            if let Some(id) = key.strip_prefix("field:") {
                let id = decimal(id).ok_or_else(|| {
                    format!("bad costs key {key:?}: a field is field:<id>, the id in decimal")
                })?;
                costs.set_field(id, *cost);
            } else {
                let f = Function::from_name(key)
                    .ok_or_else(|| format!("bad costs key {key:?}: no such NVML function"))?;
                if !f.is_device() {
                    return Err(format!(
                        "bad costs key {key:?}: not a per-device function (only those are charged)"
                    ));
                }
                costs.functions[f as usize] = *cost;
            }
        }
        Ok(Some(costs))
    }

    /// Everything free: the base of overrides without a preset.
    fn free() -> Self {
        Self {
            functions: [CallCost::FREE; Function::COUNT],
            fields: Vec::new(),
            other_fields: CallCost::FREE,
        }
    }

    /// An H200 on driver 580, as measured (CPU per call): most per-device functions take
    /// ~20 µs; the energy counter (function or field) 3.6 ms; per-process utilization
    /// 2.4 ms (also when it answers NOT_FOUND); PCIe throughput 0.7 ms of CPU and a 20 ms
    /// sampling wait.
    fn h200() -> Self {
        let mut c = Self::free();
        for f in Function::ALL.iter().filter(|f| f.is_device()) {
            c.functions[*f as usize] = CallCost::cpu(20);
        }
        let special = [
            (
                Function::nvmlDeviceGetTotalEnergyConsumption,
                CallCost::cpu(3_600),
            ),
            (
                Function::nvmlDeviceGetProcessUtilization,
                CallCost::cpu(2_400),
            ),
            (
                Function::nvmlDeviceGetPcieThroughput,
                CallCost {
                    cpu_us: 700,
                    wait_us: 20_000,
                },
            ),
            (Function::nvmlDeviceGetUtilizationRates, CallCost::cpu(150)),
            (Function::nvmlDeviceGetTotalEccErrors, CallCost::cpu(120)),
            (Function::nvmlDeviceGetPowerUsage, CallCost::cpu(90)),
        ];
        for (f, cost) in special {
            c.functions[f as usize] = cost;
        }
        c.fields = vec![
            (FI_TOTAL_ENERGY_CONSUMPTION, CallCost::cpu(3_600)),
            (FI_ENERGY, CallCost::cpu(3_600)),
            (FI_PCIE_COUNT_TX_BYTES, CallCost::cpu(170)),
            (FI_PCIE_COUNT_RX_BYTES, CallCost::cpu(170)),
        ];
        c.other_fields = CallCost::cpu(20);
        c
    }

    /// Sets (or replaces) the cost of each entry of field `id`.
    fn set_field(&mut self, id: u32, cost: CallCost) {
        match self.fields.iter_mut().find(|(f, _)| *f == id) {
            Some(entry) => entry.1 = cost,
            None => self.fields.push((id, cost)),
        }
    }

    /// What one call of `f` costs (a field-value call: before its entries).
    pub fn function(&self, f: Function) -> CallCost {
        self.functions[f as usize]
    }

    /// What one field-value entry of field `id` costs (any scope).
    pub fn field(&self, id: u32) -> CallCost {
        self.fields
            .iter()
            .find(|(f, _)| *f == id)
            .map_or(self.other_fields, |(_, c)| *c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overrides(entries: &[(&str, CallCost)]) -> BTreeMap<String, CallCost> {
        entries.iter().map(|(k, c)| ((*k).to_owned(), *c)).collect()
    }

    fn h200_with(entries: &[(&str, CallCost)]) -> Costs {
        Costs::new(Some("h200"), &overrides(entries))
            .expect("resolves")
            .expect("a cost model")
    }

    #[test]
    fn nothing_given_is_no_cost_model() {
        assert!(matches!(Costs::new(None, &BTreeMap::new()), Ok(None)));
    }

    #[test]
    fn the_h200_preset_resolves() {
        let c = h200_with(&[]);
        assert_eq!(
            c.function(Function::nvmlDeviceGetTotalEnergyConsumption),
            CallCost::cpu(3_600)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetProcessUtilization),
            CallCost::cpu(2_400)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetPcieThroughput),
            CallCost {
                cpu_us: 700,
                wait_us: 20_000
            }
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetUtilizationRates),
            CallCost::cpu(150)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetTotalEccErrors),
            CallCost::cpu(120)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetPowerUsage),
            CallCost::cpu(90)
        );
        // Every other per-device function, the field-value call itself included.
        assert_eq!(
            c.function(Function::nvmlDeviceGetTemperature),
            CallCost::cpu(20)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetFieldValues),
            CallCost::cpu(20)
        );
        // System functions are never charged.
        assert_eq!(c.function(Function::nvmlInit_v2), CallCost::FREE);
        assert_eq!(
            c.function(Function::nvmlDeviceGetHandleByIndex_v2),
            CallCost::FREE
        );
    }

    #[test]
    fn field_costs_are_per_entry_by_id() {
        let c = h200_with(&[]);
        assert_eq!(c.field(83), CallCost::cpu(3_600));
        assert_eq!(c.field(191), CallCost::cpu(3_600));
        assert_eq!(c.field(197), CallCost::cpu(170));
        assert_eq!(c.field(198), CallCost::cpu(170));
        assert_eq!(c.field(186), CallCost::cpu(20));
        assert_eq!(c.field(138), CallCost::cpu(20));
    }

    #[test]
    fn overrides_apply_on_top_of_the_preset() {
        let c = h200_with(&[
            ("nvmlDeviceGetPowerUsage", CallCost::cpu(7)),
            ("field:83", CallCost::cpu(1)),
            (
                "field:186",
                CallCost {
                    cpu_us: 2,
                    wait_us: 3,
                },
            ),
        ]);
        assert_eq!(
            c.function(Function::nvmlDeviceGetPowerUsage),
            CallCost::cpu(7)
        );
        assert_eq!(c.field(83), CallCost::cpu(1));
        assert_eq!(
            c.field(186),
            CallCost {
                cpu_us: 2,
                wait_us: 3
            }
        );
        // The rest of the preset stays.
        assert_eq!(c.field(191), CallCost::cpu(3_600));
        assert_eq!(
            c.function(Function::nvmlDeviceGetUtilizationRates),
            CallCost::cpu(150)
        );
    }

    #[test]
    fn overrides_alone_leave_the_rest_free() {
        let c = Costs::new(
            None,
            &overrides(&[
                ("nvmlDeviceGetTemperature", CallCost::cpu(5)),
                ("field:197", CallCost::cpu(9)),
            ]),
        )
        .expect("resolves")
        .expect("a cost model");
        assert_eq!(
            c.function(Function::nvmlDeviceGetTemperature),
            CallCost::cpu(5)
        );
        assert_eq!(
            c.function(Function::nvmlDeviceGetPowerUsage),
            CallCost::FREE
        );
        assert_eq!(c.field(197), CallCost::cpu(9));
        assert_eq!(c.field(83), CallCost::FREE);
    }

    #[test]
    fn unknown_presets_and_keys_are_errors() {
        let none = BTreeMap::new();
        assert!(Costs::new(Some("h100"), &none).is_err_and(|e| e.contains("h100")));
        for key in [
            "nvmlDeviceGetPowerUsag",
            "field:",
            "field:083",
            "field:83:0",
            "nvmlInit_v2",
        ] {
            let bad = overrides(&[(key, CallCost::cpu(1))]);
            assert!(
                Costs::new(Some("h200"), &bad).is_err_and(|e| e.contains(key)),
                "{key}"
            );
            assert!(Costs::new(None, &bad).is_err(), "{key}");
        }
    }
}
