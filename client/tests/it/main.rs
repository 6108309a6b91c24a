//! `gpufleet top`'s tests: layout on ratatui's test backend, the client against a real
//! demo (collector + simulated agents over loopback gRPC, in this process), and the real
//! binary in tmux.

mod common;
mod e2e;
mod layout;
mod secure;
mod tmux;
