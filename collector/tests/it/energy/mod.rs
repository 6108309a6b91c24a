//! Energy accounting through the real store: known traces, late data, the check, the CLI.
//!
//! Shared here: trace builders, the idle options and the store look-ups every area uses.

mod api;
mod attribution;
mod check;
mod exec;
mod live;
mod passes;
mod retention;
mod traces;
mod waste;

use crate::common::*;
use gpufleet_collector::accounting::accountant::{
    Accountant, EnergyOptions, IdleConfig, IdleWatts,
};
use gpufleet_collector::accounting::check as energy_check;
use gpufleet_collector::accounting::energy::IdlePolicy;
use gpufleet_collector::live::state::{Committed, Live};
use gpufleet_collector::live::status::Clock;
use gpufleet_collector::store::{NodeRecord, Store, TimeRange};
use gpufleet_core::GpuSource;
use gpufleet_core::*;
use gpufleet_sim::{SimOptions, simulator};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

const MIN: i64 = 60_000;

fn clock_at(t: UnixMs) -> Clock {
    Arc::new(move || t)
}

fn all_time() -> TimeRange {
    TimeRange {
        from_ms: 0,
        to_ms: T0 + 1000 * MIN,
    }
}

fn process(uuid: &str, pid: u32, sm: u32, workload: Workload) -> ProcessSample {
    ProcessSample {
        gpu_uuid: uuid.into(),
        pid,
        process_type: ProcessType::Compute,
        user: Some("lena".into()),
        command: Some("python serve.py".into()),
        gpu_mem_bytes: Some(4 << 30),
        sm_util_pct: Some(sm),
        mem_util_pct: None,
        enc_util_pct: None,
        dec_util_pct: None,
        workload,
        mig_uuid: None,
    }
}

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// One tick of GPU `uuid` at `t` with power `power_mw`, counter `energy_mj`, and
/// containers A (SM 60 %) and B (SM 20 %).
fn shared_tick(uuid: &str, t: UnixMs, power_mw: u32, energy_mj: Option<u64>) -> Tick {
    Tick {
        time_ms: t,
        gpus: vec![GpuSample {
            gpu_uuid: uuid.into(),
            util_gpu_pct: Some(80),
            power_mw: Some(power_mw),
            energy_mj,
            ..Default::default()
        }],
        processes: vec![
            process(uuid, 100, 60, container_workload(A, Some("trainer"))),
            process(uuid, 200, 20, container_workload(B, Some("inference"))),
        ],
        ..Default::default()
    }
}

async fn one_gpu_node(store: &Arc<dyn Store>, uuid: &str) -> NodeRecord {
    store
        .register_node(&hello("n1"), &inventory(vec![gpu_info_sparse(uuid, 0)]), T0)
        .await
        .expect("register")
}

fn options(idle_w: u32, policy: IdlePolicy) -> EnergyOptions {
    EnergyOptions {
        idle_policy: policy,
        idle: IdleConfig {
            default: IdleWatts::Milliwatts(idle_w * 1000),
            per_model: vec![],
        },
        ..Default::default()
    }
}

/// mJ of workload `key` in the stored rollups.
async fn stored_mj(store: &Arc<dyn Store>, key: &str) -> u64 {
    store
        .workload_energy(all_time(), None, Some(key))
        .await
        .expect("workload energy")
        .iter()
        .map(|r| r.energy_mj)
        .sum()
}

const GIB: u64 = 1 << 30;

/// A process of `workload` with its own SM share, memory and type.
fn proc_with(
    uuid: &str,
    pid: u32,
    sm: u32,
    mem: u64,
    kind: ProcessType,
    workload: Workload,
) -> ProcessSample {
    ProcessSample {
        gpu_mem_bytes: Some(mem),
        process_type: kind,
        ..process(uuid, pid, sm, workload)
    }
}

/// A node `name` with GPUs `uuids`, all of model `model`.
async fn node_of(store: &Arc<dyn Store>, name: &str, model: &str, uuids: &[&str]) -> NodeRecord {
    let gpus = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| GpuInfo {
            name: model.into(),
            ..gpu_info_sparse(u, i as u32)
        })
        .collect();
    store
        .register_node(&hello(name), &inventory(gpus), T0)
        .await
        .expect("register")
}

/// mJ per workload key on one GPU in the stored rollups.
async fn mj_on(store: &Arc<dyn Store>, key: &str, gpu: &str) -> u64 {
    store
        .workload_energy(all_time(), None, Some(key))
        .await
        .expect("workload energy")
        .iter()
        .filter(|r| r.gpu_uuid == gpu)
        .map(|r| r.energy_mj)
        .sum()
}

const C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
const X: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

async fn get_json(store: &Arc<dyn Store>, uri: &str) -> (u16, serde_json::Value) {
    get_json_live(store, Arc::new(Live::new()), uri).await
}

async fn get_json_live(
    store: &Arc<dyn Store>,
    live: Arc<Live>,
    uri: &str,
) -> (u16, serde_json::Value) {
    let (status, _, body) = api_get_live(store, live, T0 + 10 * MIN, uri).await;
    (status, serde_json::from_slice(&body).expect("json"))
}
