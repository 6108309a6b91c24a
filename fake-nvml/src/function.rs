//! The NVML functions the fake exports, as a small enum: a call's count and a GPU's
//! "unsupported" flag are array slots indexed by it, so the per-call bookkeeping compares
//! no strings (the fake's own cost is charged to every monitor measured against it).

use nvml_wrapper_sys::bindings::nvmlReturn_t;

/// An NVML result: the error is the return code.
pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

/// Declares [`Function`] from the C names, with its name table.
macro_rules! functions {
    ($($name:ident),* $(,)?) => {
        /// An exported NVML function, named as in C (the name its count has in the counts
        /// file and in a scenario's `unsupported`).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Function {
            $($name,)*
        }

        impl Function {
            /// Every function, in declaration order (`ALL[f as usize] == f`).
            pub const ALL: &[Function] = &[$(Function::$name,)*];

            /// The C name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Function::$name => stringify!($name),)*
                }
            }
        }
    };
}

functions! {
    // System.
    nvmlInit_v2,
    nvmlInitWithFlags,
    nvmlShutdown,
    nvmlSystemGetDriverVersion,
    nvmlSystemGetNVMLVersion,
    nvmlSystemGetCudaDriverVersion_v2,
    nvmlDeviceGetCount_v2,
    nvmlDeviceGetHandleByIndex_v2,
    nvmlDeviceGetHandleByUUID,
    nvmlEventSetCreate,
    nvmlEventSetWait_v2,
    nvmlEventSetFree,
    // GPM samples and metrics (no device handle).
    nvmlGpmSampleAlloc,
    nvmlGpmSampleFree,
    nvmlGpmMetricsGet,
    // Static device facts.
    nvmlDeviceGetUUID,
    nvmlDeviceGetName,
    nvmlDeviceGetSerial,
    nvmlDeviceGetVbiosVersion,
    nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMigDeviceHandleByIndex,
    nvmlDeviceGetArchitecture,
    nvmlDeviceGetBrand,
    nvmlDeviceGetPowerManagementDefaultLimit,
    nvmlDeviceGetEnforcedPowerLimit,
    nvmlDeviceGetComputeMode,
    nvmlDeviceGetPersistenceMode,
    nvmlDeviceGetMaxPcieLinkGeneration,
    nvmlDeviceGetMaxPcieLinkWidth,
    nvmlDeviceGetNumFans,
    nvmlDeviceGetPciInfo_v3,
    nvmlDeviceGetPowerManagementLimitConstraints,
    nvmlDeviceGetMaxClockInfo,
    nvmlDeviceGetNvLinkState,
    nvmlDeviceGetMigMode,
    nvmlDeviceGetCudaComputeCapability,
    // Per-tick readings.
    nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTotalEnergyConsumption,
    nvmlDeviceGetPerformanceState,
    nvmlDeviceGetCurrentClocksThrottleReasons,
    nvmlDeviceGetUtilizationRates,
    nvmlDeviceGetMemoryInfo_v2,
    nvmlDeviceGetTemperature,
    nvmlDeviceGetFanSpeed_v2,
    nvmlDeviceGetClockInfo,
    nvmlDeviceGetPcieThroughput,
    nvmlDeviceGetTotalEccErrors,
    nvmlDeviceGetEncoderUtilization,
    nvmlDeviceGetDecoderUtilization,
    nvmlDeviceGetFieldValues,
    // Processes.
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetGraphicsRunningProcesses_v3,
    nvmlDeviceGetProcessUtilization,
    // Health.
    nvmlDeviceGetRetiredPages,
    nvmlDeviceGetRetiredPages_v2,
    nvmlDeviceGetRetiredPagesPendingStatus,
    nvmlDeviceGetPcieReplayCounter,
    nvmlDeviceGetNvLinkErrorCounter,
    nvmlDeviceGetTemperatureThreshold,
    // Events.
    nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents,
    // GPM.
    nvmlGpmQueryDeviceSupport,
    nvmlGpmSampleGet,
    nvmlGpmMigSampleGet,
}

impl Function {
    /// How many functions there are (the length of a count array).
    pub const COUNT: usize = Self::ALL.len();

    /// The function with C name `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// Whether it is a per-device function (takes a device handle, counts per GPU, and
    /// pays a cost model's cost); the rest are system functions (init, shutdown, driver
    /// facts, handle lookups, event sets, GPM sample handles and metrics).
    pub const fn is_device(self) -> bool {
        !matches!(
            self,
            Self::nvmlInit_v2
                | Self::nvmlInitWithFlags
                | Self::nvmlShutdown
                | Self::nvmlSystemGetDriverVersion
                | Self::nvmlSystemGetNVMLVersion
                | Self::nvmlSystemGetCudaDriverVersion_v2
                | Self::nvmlDeviceGetCount_v2
                | Self::nvmlDeviceGetHandleByIndex_v2
                | Self::nvmlDeviceGetHandleByUUID
                | Self::nvmlEventSetCreate
                | Self::nvmlEventSetWait_v2
                | Self::nvmlEventSetFree
                | Self::nvmlGpmSampleAlloc
                | Self::nvmlGpmSampleFree
                | Self::nvmlGpmMetricsGet
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Function;

    #[test]
    fn all_is_indexed_by_the_enum_and_names_round_trip() {
        for (k, f) in Function::ALL.iter().enumerate() {
            assert_eq!(*f as usize, k);
            assert_eq!(Function::from_name(f.name()), Some(*f));
        }
        assert_eq!(
            Function::nvmlDeviceGetPowerUsage.name(),
            "nvmlDeviceGetPowerUsage"
        );
        assert_eq!(Function::from_name("nvmlDeviceGetFanSpeed"), None);
    }

    #[test]
    fn system_functions_are_not_device_functions() {
        assert!(!Function::nvmlInit_v2.is_device());
        assert!(!Function::nvmlDeviceGetHandleByIndex_v2.is_device());
        assert!(!Function::nvmlEventSetWait_v2.is_device());
        assert!(!Function::nvmlGpmMetricsGet.is_device());
        assert!(Function::nvmlGpmSampleGet.is_device());
        assert!(Function::nvmlDeviceGetUUID.is_device());
        assert!(Function::nvmlDeviceRegisterEvents.is_device());
        // Declaration order: the system functions first, then the device functions.
        let first_device = Function::ALL
            .iter()
            .position(|f| f.is_device())
            .expect("device functions");
        assert!(Function::ALL[first_device..].iter().all(|f| f.is_device()));
    }
}
