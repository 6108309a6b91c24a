//! The collector's HTTP API response types, shared by the server (which serializes them)
//! and its clients (which deserialize them), so both read and write one definition.
//!
//! - [`status`]: a node's liveness; [`health`]: judged health and its reasons;
//!   [`xid`]: an Xid catalogue entry.
//! - [`nodes`]: `GET /api/v1/nodes` and `/api/v1/nodes/{name}`; [`fleet`]:
//!   `GET /api/v1/fleet`; [`events`]: `GET /api/v1/nodes/{name}/events`.
//! - [`energy`]: `GET /api/v1/containers`, `GET /api/v1/energy/series`.
//! - [`live`]: the `tick` and `status` events of `GET /api/v1/live`.
//! - [`error`]: the body of every error answer.
//!
//! Names, fields and units are the API's; an absent value is `null` (`None`), never 0.
//! Feature `openapi` derives their OpenAPI schemas (utoipa), for the collector's
//! description of its API (`/api/v1/openapi.json`); their doc comments are the schemas'
//! descriptions.

pub mod energy;
pub mod error;
pub mod events;
pub mod fleet;
pub mod health;
pub mod live;
pub mod nodes;
pub mod status;
pub mod xid;

pub use energy::{
    CarbonView, ContainerRow, ContainersView, EnergyBand, EnergySeriesView, GpuRef, MethodMix,
    SplitMix,
};
pub use error::ErrorBody;
pub use events::{EventView, EventsView};
pub use fleet::{
    FleetGpu, FleetGpuLatest, FleetHealth, FleetHost, FleetHostLatest, FleetNode, FleetReason,
};
pub use health::{GpuHealth, HealthReason, HealthState, NodeHealth};
// `live::HostView` is not here: `nodes::HostView` has the name.
pub use live::{StatusNode, StatusView, TickGpu, TickView};
pub use nodes::{GpuLatestView, GpuView, HostLatestView, HostView, NodeView, SpoolView};
pub use status::NodeStatus;
pub use xid::{Severity, XidInfo};
