//! The fleet's loop: every heartbeat, renew this instance's row, read the others', compute who
//! owns which database, take or renew the leases of this instance's share and start its work,
//! hand over what belongs to another; every refresh, read the set of databases again.

use std::{
    collections::BTreeSet,
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;

use super::{FleetDatabase, Shared, assign::assign, budget, checked, members, tenant::Tenant};
use crate::{
    health::LoopHealth,
    store::lease::{acquire_lease, release_lease},
};

pub(super) async fn run(shared: &Arc<Shared>, shutdown: &CancellationToken, health: &LoopHealth) {
    let mut refreshed = Instant::now();
    loop {
        if refreshed.elapsed() >= shared.refresh {
            refreshed = Instant::now();
            match shared.source.databases().await.map_err(|e| e.to_string()) {
                Ok(databases) => match checked(databases) {
                    Ok(databases) => apply_set(shared, databases).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "the set of databases was not applied; the one read before stays")
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "the set of databases could not be read; the one read before stays")
                }
            }
        }
        match tick(shared).await {
            Ok(()) => health.success(),
            Err(e) => {
                health.failure(&format!("control database: {e}"));
                tracing::warn!(error = %e, "the fleet could not reach its control database; each instance keeps what it owns");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(shared.heartbeat) => {}
        }
    }
    leave(shared).await;
}

/// Serve `databases`: start the new ones (fast path only until the next tick assigns them),
/// stop the ones gone and give their leases up. A new one is asked for its server first, and
/// with a connection budget one the fleet never served joins only within its server's budget.
pub(super) async fn apply_set(shared: &Shared, databases: Vec<FleetDatabase>) {
    let wanted: BTreeSet<String> = databases.iter().map(|d| d.name.clone()).collect();
    let gone: Vec<Arc<Tenant>> = {
        let mut tenants = shared.tenants.write().unwrap_or_else(|p| p.into_inner());
        let gone = tenants
            .keys()
            .filter(|name| !wanted.contains(*name))
            .cloned()
            .collect::<Vec<_>>();
        gone.iter()
            .filter_map(|name| tenants.remove(name))
            .collect()
    };
    for tenant in gone {
        tracing::info!(database = %tenant.name, "a database left the set; no longer served");
        let owned = tenant.is_owner();
        tenant.stop().await;
        if owned {
            let lease = shared.names.database(&tenant.name);
            let _ = release_lease(&shared.control, &lease, &shared.instance).await;
        }
    }
    {
        let mut refused = shared.refused.write().unwrap_or_else(|p| p.into_inner());
        refused.retain(|name, _| {
            let keep = wanted.contains(name);
            if !keep {
                crate::metrics::fleet_database_refused(name, false);
            }
            keep
        });
    }
    let new: Vec<FleetDatabase> = databases
        .into_iter()
        .filter(|d| shared.tenant(&d.name).is_none())
        .collect();
    if new.is_empty() {
        return;
    }
    // Each new database's server, asked at once, each within a heartbeat (a database that does
    // not answer must not hold the fleet's loop up).
    let footprints = futures_util::future::join_all(
        new.iter()
            .map(|d| tokio::time::timeout(shared.heartbeat, budget::probe(&d.db))),
    )
    .await;
    // Databases some instance has held the lease of are served already: never refused.
    let membership = match shared.connections_per_server {
        Some(_) => members::read(&shared.control, &shared.names).await.ok(),
        None => None,
    };
    let instances = shared.instances.load(Ordering::Relaxed);
    let mut served: Vec<budget::Footprint> = shared
        .tenants()
        .iter()
        .filter_map(|t| t.footprint.clone())
        .collect();
    for (database, footprint) in new.into_iter().zip(footprints) {
        let footprint = match footprint {
            Ok(Ok(footprint)) => Ok(footprint),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", shared.heartbeat)),
        };
        let verdict = match (shared.connections_per_server, &footprint) {
            (None, _) | (Some(_), Ok(None)) => Ok(()),
            (Some(_), Err(e)) => Err(format!(
                "its server could not be asked how many connections it takes ({e}); tried \
                 again at the next refresh"
            )),
            (Some(limit), Ok(Some(footprint))) => {
                let known = membership.as_ref().is_some_and(|m| {
                    m.leases
                        .contains_key(&shared.names.database(&database.name))
                });
                if known {
                    Ok(())
                } else {
                    budget::admit(footprint, &served, instances, limit)
                }
            }
        };
        if let Err(why) = verdict {
            let mut refused = shared.refused.write().unwrap_or_else(|p| p.into_inner());
            if refused.get(&database.name) != Some(&why) {
                tracing::error!(database = %database.name, reason = %why, "a database of the set is refused");
            }
            refused.insert(database.name.clone(), why);
            crate::metrics::fleet_database_refused(&database.name, true);
            continue;
        }
        if let Err(e) = &footprint {
            tracing::warn!(database = %database.name, error = %e, "could not ask the database's server for its connections; not counted");
        }
        let footprint = footprint.ok().flatten();
        if shared
            .refused
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&database.name)
            .is_some()
        {
            crate::metrics::fleet_database_refused(&database.name, false);
        }
        served.extend(footprint.clone());
        tracing::info!(database = %database.name, "a database joined the set");
        let tenant = Arc::new(Tenant::new(shared, database, footprint));
        tenant.disown(shared).await;
        shared
            .tenants
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant.name.clone(), tenant);
    }
}

/// Report each server's connection ceiling and limit; warn when a ceiling is over its limit,
/// once per change.
fn report_connections(shared: &Shared, tenants: &[Arc<Tenant>], instances: usize) {
    let loads = budget::loads(
        tenants.iter().filter_map(|t| t.footprint.as_ref()),
        instances,
        shared.connections_per_server,
    );
    let mut reported = shared.reported.lock().unwrap_or_else(|p| p.into_inner());
    for (server, load) in &loads {
        crate::metrics::fleet_server_connections(server, load.ceiling, load.limit);
        let over = load.limit.is_some_and(|limit| load.ceiling > limit);
        if over && reported.get(server) != Some(load) {
            tracing::warn!(
                server = %server, ceiling = load.ceiling, limit = ?load.limit, instances,
                "the service's instances can open more connections on this database server than \
                 its limit: give the tenants' pools fewer connections or raise the budget"
            );
        }
    }
    for server in reported.keys() {
        if !loads.contains_key(server) {
            crate::metrics::fleet_server_connections(server, 0, None);
        }
    }
    *reported = loads;
}

/// One heartbeat: renew, read, assign, take and hand over.
async fn tick(shared: &Shared) -> Result<(), DbErr> {
    let me = shared.instance.as_str();
    acquire_lease(
        &shared.control,
        &shared.names.instance(me),
        me,
        shared.lease,
    )
    .await?;
    let membership = members::read(&shared.control, &shared.names).await?;
    let mut instances: Vec<&str> = membership.instances.iter().map(String::as_str).collect();
    if !instances.contains(&me) {
        instances.push(me);
    }
    shared.instances.store(instances.len(), Ordering::Relaxed);
    let tenants = shared.tenants();
    report_connections(shared, &tenants, instances.len());
    let names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let owners = assign(&instances, &names);
    for tenant in &tenants {
        let lease = shared.names.database(&tenant.name);
        let mine = owners.get(tenant.name.as_str()) == Some(&me);
        let holder = membership.owner(&shared.names, &tenant.name);
        let owned = if mine && holder.is_none_or(|h| h == me) {
            acquire_lease(&shared.control, &lease, me, shared.lease).await?
        } else {
            if tenant.is_owner() || holder == Some(me) {
                // Stop first (claims handed back), then let the next owner in.
                tenant.disown(shared).await;
                release_lease(&shared.control, &lease, me).await?;
            }
            false
        };
        if owned {
            tenant.own(shared).await;
        } else if tenant.is_owner() {
            tenant.disown(shared).await;
        }
        let someone = owned || holder.is_some_and(|h| h != me);
        crate::metrics::fleet_database_owned(&tenant.name, someone);
    }
    crate::metrics::fleet_owned_here(tenants.iter().filter(|t| t.is_owner()).count());
    Ok(())
}

/// Leaving: stop every database's loops, then give the leases and the heartbeat up, so that the
/// others take over at their next heartbeat instead of after the lease.
async fn leave(shared: &Shared) {
    let tenants = shared.tenants();
    let owned: Vec<&Arc<Tenant>> = tenants.iter().filter(|t| t.is_owner()).collect();
    for tenant in &tenants {
        tenant.stop().await;
    }
    for tenant in owned {
        let lease = shared.names.database(&tenant.name);
        if let Err(e) = release_lease(&shared.control, &lease, &shared.instance).await {
            tracing::debug!(error = %e, database = %tenant.name, "could not give a lease up; it expires");
        }
    }
    crate::metrics::fleet_owned_here(0);
    let me = shared.names.instance(&shared.instance);
    if let Err(e) = release_lease(&shared.control, &me, &shared.instance).await {
        tracing::debug!(error = %e, "could not give the heartbeat up; it expires");
    }
}
