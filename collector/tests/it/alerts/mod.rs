//! Alerts: the store's `AlertStore` contract on both backends (`contract`), the alerts
//! job in a real collector notifying a local JSON webhook that answers 500 first
//! (`webhook`), and a real Alertmanager receiving an alert that fires then resolves
//! (`alertmanager_real`).

mod alertmanager_real;
mod contract;
mod webhook;
