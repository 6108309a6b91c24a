//! The Xid catalogue: what an Xid code means, what usually causes it, what an operator
//! should do, and how bad it is.
//!
//! Compiled from NVIDIA's public Xid documentation, "Xid Errors"
//! (<https://docs.nvidia.com/deploy/xid-errors/>), its "Analyzing Xid Errors with the Xid
//! Catalog" table for Ampere and newer GPUs (mnemonics, immediate / investigatory
//! resolution buckets) and its older per-code cause table, as published in November 2026
//! (read 2026-11-25). The wording here is ours, written for an operator looking at a fleet;
//! severities are an operations judgement (does the GPU need attention before its next
//! job?), not NVIDIA's. The meaning of a code is the same across driver versions; a code
//! not listed gets [`explain`]'s generic entry, never a panic.

// How bad an Xid is, and one catalogue entry: the API's own types, shared with its clients.
pub use gpufleet_api::{Severity, XidInfo};

/// `(code, name, meaning, cause, action, severity)`, sorted by code.
type Entry = (
    u64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Severity,
);

use Severity::{Critical, Info, Warning};

const CATALOGUE: &[Entry] = &[
    (
        8,
        "GPU stopped processing",
        "A channel stopped making progress and the driver timed it out.",
        "Usually the application (a hung kernel, a deadlock); sometimes the driver, a bus problem or an earlier hardware error.",
        "Restart the application. If it recurs with different applications, check for other Xids on the GPU and contact support.",
        Warning,
    ),
    (
        13,
        "Graphics engine exception",
        "The GPU's compute/graphics engine hit an exception while running a program.",
        "Most often a bug in the application (out-of-range access, illegal instruction); rarely a driver or hardware fault.",
        "Restart the application and debug it (e.g. compute-sanitizer). Suspect the GPU only if it recurs with known-good software or comes with ECC/bus Xids.",
        Info,
    ),
    (
        31,
        "GPU memory page fault",
        "A program touched GPU memory it had no mapping for (an MMU fault).",
        "Almost always an illegal address in the application; rarely a driver bug or memory corruption.",
        "Restart the application and debug its memory accesses. Suspect the GPU only if many different programs fault on it.",
        Info,
    ),
    (
        32,
        "Invalid or corrupted push buffer stream",
        "Commands reaching the GPU over the bus were corrupt.",
        "PCIe problems (signal integrity, riser, slot), system memory corruption, or a driver bug.",
        "Check the PCIe link (replay counter, link width/speed, dmesg AER messages) and system memory; reseat or move the GPU if it recurs.",
        Warning,
    ),
    (
        38,
        "Driver firmware error",
        "Firmware running on the GPU reported an error to the driver.",
        "A driver or firmware problem.",
        "Reset the GPU; update the driver if it recurs, and contact support.",
        Warning,
    ),
    (
        43,
        "GPU stopped processing (channel reset)",
        "The driver reset a channel that had faulted; the application owning it was stopped.",
        "Follows an application fault (often an Xid 13 or 31 just before); the GPU itself is fine.",
        "Nothing on the GPU. Look at the application that was stopped.",
        Info,
    ),
    (
        44,
        "Graphics engine fault during context switch",
        "The engine faulted while switching between contexts.",
        "A driver problem, or hardware.",
        "Reset the GPU. If it recurs, update the driver and contact support.",
        Critical,
    ),
    (
        45,
        "Preemptive cleanup after an earlier error",
        "The driver tore down a context because of an earlier error or because its process ended.",
        "A consequence of something else: the application was killed, or another Xid (often an ECC error) ended it.",
        "Look for the Xid logged just before it; this one alone needs no action.",
        Info,
    ),
    (
        46,
        "GPU stopped processing (engine timeout)",
        "An engine stopped responding and the driver could not recover the channel.",
        "A driver or hardware problem.",
        "Drain the GPU and reset it; contact support if it recurs.",
        Critical,
    ),
    (
        48,
        "Double-bit ECC error",
        "GPU memory returned an uncorrectable (double-bit) ECC error.",
        "A memory cell failed or a transient upset hit; the affected data was lost and applications using it were stopped.",
        "Drain the GPU and reset it (or reboot) so the bad row is remapped / page retired. If it recurs or remapping fails, send the GPU for service (RMA).",
        Critical,
    ),
    (
        54,
        "Auxiliary power not connected",
        "The GPU detected that its auxiliary power cable is missing or not supplying power.",
        "A loose or missing PCIe power cable, or a failing power supply.",
        "Power the node down and check the GPU's power cables and the PSU.",
        Critical,
    ),
    (
        56,
        "Display engine error",
        "The display engine reported an error.",
        "A driver or hardware problem with display output (rare on compute GPUs).",
        "Update the driver; if it recurs without a display attached, contact support.",
        Warning,
    ),
    (
        57,
        "Error programming video memory interface",
        "The driver failed to program the GPU's memory interface.",
        "Hardware (memory interface or frame buffer), occasionally the driver.",
        "Reset the GPU; if it recurs, run field diagnostics and service the GPU.",
        Critical,
    ),
    (
        58,
        "Unstable video memory interface",
        "The GPU's memory interface was detected as unstable (EDC errors).",
        "Hardware: the memory or its interface, possibly aggravated by temperature.",
        "Check cooling, reset the GPU, and run field diagnostics; service it if it recurs.",
        Critical,
    ),
    (
        61,
        "Internal micro-controller breakpoint/warning",
        "A microcontroller inside the GPU hit a breakpoint or reported a warning.",
        "Firmware or driver problems; sometimes followed by an Xid 62.",
        "Watch the GPU; reset it if it misbehaves, update the driver if it recurs.",
        Warning,
    ),
    (
        62,
        "Internal micro-controller halt",
        "A microcontroller inside the GPU halted.",
        "Firmware or driver problems, thermal issues, or hardware.",
        "Drain and reset the GPU; check cooling. Update the driver and contact support if it recurs.",
        Critical,
    ),
    (
        63,
        "ECC page retirement or row remap recorded",
        "The GPU recorded a memory page for retirement or a row for remapping after ECC errors.",
        "ECC errors in GPU memory; the repair takes effect at the next GPU reset (remap) or reboot (retirement).",
        "Reset the GPU (or reboot the node) when convenient so the repair takes effect. Watch for repeated remaps on the same GPU.",
        Warning,
    ),
    (
        64,
        "ECC page retirement or row remap failed",
        "The GPU could not record a page retirement or row remap.",
        "No spare rows left in a bank, or an InfoROM problem: the memory cannot be repaired in the field.",
        "Drain the GPU and send it for service (RMA).",
        Critical,
    ),
    (
        65,
        "Video processor exception",
        "The video encoder/decoder engine raised an exception.",
        "A driver or hardware problem in the video engines.",
        "Restart the application; reset the GPU if it recurs.",
        Warning,
    ),
    (
        68,
        "Video decoder (NVDEC) exception",
        "The video decoder engine raised an exception.",
        "Usually the application or a corrupt stream; rarely hardware.",
        "Restart the application; suspect the GPU only if it recurs with known-good streams.",
        Warning,
    ),
    (
        69,
        "Graphics engine class error",
        "The engine rejected an invalid command class or method.",
        "Usually the application or driver; rarely hardware.",
        "Restart the application; update the driver if it recurs.",
        Warning,
    ),
    (
        74,
        "NVLink error",
        "An NVLink connection between GPUs (or to an NVSwitch) reported a fatal or recovery-requiring error.",
        "A faulty link: connector, cable/bridge, NVSwitch, or the GPU; sometimes a driver / Fabric Manager problem.",
        "Drain the GPU and reset it (with its NVLink peers where required). If the same link keeps failing, check the NVLink error counters and service the link or GPU.",
        Critical,
    ),
    (
        79,
        "GPU has fallen off the bus",
        "The GPU stopped answering on PCIe: the driver can no longer reach it.",
        "Hardware failure, power delivery problems (PSU, cables, power brake), overheating, or PCIe link/slot problems.",
        "Drain the node and reboot it (a GPU reset rarely recovers it). Check power, cooling and the PCIe slot; if it recurs, service the GPU.",
        Critical,
    ),
    (
        92,
        "High single-bit ECC error rate",
        "The GPU corrected an unusually high rate of single-bit memory errors.",
        "Memory degrading, or a hot spot; data is still correct.",
        "Watch the GPU's ECC counters and remapping state; plan a reset, and service it if the rate keeps up.",
        Warning,
    ),
    (
        93,
        "InfoROM wear limit exceeded",
        "The GPU's InfoROM (its on-board configuration/error store) passed a provisioned write limit.",
        "Heavy error logging over the GPU's life.",
        "Contact support; the GPU keeps working.",
        Warning,
    ),
    (
        94,
        "Contained ECC error",
        "An uncorrectable memory error was contained: only the applications using that memory were stopped.",
        "A memory cell failure or upset; the GPU isolated it (Ampere and newer).",
        "Other work may continue. Drain the GPU when convenient and reset it so the row is remapped; service it if contained errors recur.",
        Warning,
    ),
    (
        95,
        "Uncontained ECC error",
        "An uncorrectable memory error could not be contained: every application on the GPU is affected.",
        "A memory failure the GPU could not isolate.",
        "Drain the GPU now and reset it (all its work is lost). If it recurs, or the row remap fails, send it for service.",
        Critical,
    ),
    (
        109,
        "Context switch timeout",
        "The GPU did not finish a context switch in time.",
        "Usually the application (a long-running or hung kernel) or the driver; occasionally hardware.",
        "Restart the application; reset the GPU if it recurs with other applications, and contact support.",
        Warning,
    ),
    (
        119,
        "GSP RPC timeout",
        "The GPU System Processor (the firmware running the GPU) did not answer the driver in time.",
        "A firmware or driver problem, or a GPU that is wedged by an earlier error.",
        "Drain and reset the GPU (reboot if the reset fails). Update the driver if it recurs, and contact support.",
        Critical,
    ),
    (
        120,
        "GSP error",
        "The GPU System Processor reported an internal error.",
        "A firmware or driver problem, or hardware.",
        "Drain and reset the GPU (reboot if the reset fails); update the driver and contact support if it recurs.",
        Critical,
    ),
    (
        121,
        "C2C link error",
        "The chip-to-chip link between the GPU and its CPU (Grace Hopper / Grace Blackwell) reported an error.",
        "The C2C interconnect or its firmware.",
        "Watch for recurrence; if it repeats, reset the GPU (or reboot the node) and contact support.",
        Warning,
    ),
    (
        140,
        "Unrecovered ECC error",
        "The GPU found memory with an uncorrectable ECC error that was not yet recovered.",
        "A memory failure, e.g. found at start-up or left over from an earlier error.",
        "Drain the GPU and reset it so the memory is repaired; service it if it recurs.",
        Critical,
    ),
    (
        143,
        "GPU initialization failure",
        "The GPU failed to initialise (its firmware or hardware did not come up).",
        "Hardware, firmware or power problems.",
        "Reset the GPU or reboot the node; if it still fails, service the GPU.",
        Critical,
    ),
    (
        154,
        "GPU recovery action changed",
        "The driver says the GPU now needs a recovery action (reset, reboot or drain) before it can be used normally.",
        "Follows another error that left the GPU needing recovery.",
        "Do the recovery the message names (usually reset the GPU or reboot the node).",
        Critical,
    ),
];

/// The catalogue entry for `code`; a generic entry for a code not in the catalogue.
pub fn explain(code: u64) -> XidInfo {
    match CATALOGUE.binary_search_by_key(&code, |e| e.0) {
        Ok(i) => {
            let (code, name, meaning, cause, action, severity) = CATALOGUE[i];
            XidInfo {
                code,
                name: name.to_owned(),
                meaning: meaning.to_owned(),
                cause: cause.to_owned(),
                action: action.to_owned(),
                severity,
                known: true,
            }
        }
        Err(_) => XidInfo {
            code,
            name: "Unlisted Xid".to_owned(),
            meaning: "The driver reported an Xid this catalogue does not describe.".to_owned(),
            cause: "Hardware, driver or application; see NVIDIA's Xid catalogue for this code."
                .to_owned(),
            action: "Look the code up in NVIDIA's Xid documentation (docs.nvidia.com/deploy/xid-errors) and check the kernel log around it; contact support if it recurs.".to_owned(),
            severity: Warning,
            known: false,
        },
    }
}

/// Every catalogued code, ascending.
pub fn codes() -> impl Iterator<Item = u64> {
    CATALOGUE.iter().map(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_is_sorted_and_covers_what_operators_meet() {
        assert!(
            CATALOGUE.windows(2).all(|w| w[0].0 < w[1].0),
            "sorted, unique"
        );
        for code in [
            13, 31, 32, 43, 45, 48, 56, 57, 58, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109,
            119, 120, 121, 140, 143,
        ] {
            let x = explain(code);
            assert!(x.known, "Xid {code} is catalogued");
            assert_eq!(x.code, code);
            for text in [x.name, x.meaning, x.cause, x.action] {
                assert!(!text.is_empty(), "Xid {code} has every field");
            }
        }
    }

    #[test]
    fn severities_follow_what_the_code_says_about_the_gpu() {
        for code in [48, 62, 64, 74, 79, 95, 119, 120, 140, 143] {
            assert_eq!(explain(code).severity, Critical, "Xid {code}");
        }
        for code in [63, 92, 94] {
            assert_eq!(explain(code).severity, Warning, "Xid {code}");
        }
        for code in [13, 31, 43, 45] {
            assert_eq!(explain(code).severity, Info, "Xid {code}");
        }
    }

    #[test]
    fn unknown_codes_get_the_generic_entry() {
        for code in [0, 1, 9_999, u64::MAX] {
            let x = explain(code);
            assert!(!x.known);
            assert_eq!((x.code, x.severity), (code, Warning));
        }
    }
}
