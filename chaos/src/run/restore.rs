//! Undoing faults: one timed revert, the restore of everything at the
//! end (also on Ctrl-C and on an alarm), and reading it back.

use std::time::Duration;

use super::{Revert, Running};
use crate::report::Restore;

impl Running<'_, '_> {
    /// Undoes one fault; returns what it did.
    pub(super) async fn revert(&mut self, r: Revert) -> String {
        match r {
            Revert::Backends(names) => {
                let mut problems = Vec::new();
                for name in &names {
                    let Some(m) = self.d.mocks.iter().find(|m| &m.name == name).cloned() else {
                        continue;
                    };
                    if let Err(e) = self.patch(&m.url, &m.baseline).await {
                        problems.push(e);
                    }
                }
                if problems.is_empty() {
                    format!("faults restored on {}", names.join(", "))
                } else {
                    format!("could not restore: {}", problems.join("; "))
                }
            }
            Revert::Resume(id) => {
                let result = match self.d.local.as_mut() {
                    Some(l) => l.resume(id).await.map_err(|e| format!("{e:#}")),
                    None => Err("needs a local target".into()),
                };
                self.load.set_rotation(id, true);
                match result {
                    Ok(()) => format!("node {id} resumed (SIGCONT)"),
                    Err(e) => format!("could not resume node {id}: {e}"),
                }
            }
            Revert::Uncut(links) => {
                if let Some(l) = &self.d.local {
                    let mut cuts = l.relays.cuts();
                    for link in &links {
                        cuts.remove(link);
                    }
                    l.relays.set(cuts);
                }
                format!("healed {} links", links.len())
            }
        }
    }

    /// Restores every fault the drill may have left: every mock's faults
    /// to their start values, partitions healed, paused nodes resumed,
    /// killed nodes started.
    pub(super) async fn restore_all(&mut self) -> Vec<String> {
        let mut actions = Vec::new();
        self.pending.clear();
        let names: Vec<String> = self.d.mocks.iter().map(|m| m.name.clone()).collect();
        if !names.is_empty() {
            actions.push(self.revert(Revert::Backends(names)).await);
        }
        if let Some(l) = self.d.local.as_mut() {
            let cut = l.relays.cuts().len();
            l.relays.heal();
            if cut > 0 {
                actions.push(format!("healed {cut} cut links"));
            }
            actions.extend(l.restore_nodes().await);
        }
        for n in self.d.nodes.clone() {
            self.load.set_rotation(n.id, true);
        }
        for a in &actions {
            self.event("restore", a.clone());
        }
        actions
    }

    /// Reads everything back: each mock's faults equal to the start, each
    /// node running and answering.
    pub(super) async fn verify_restore(&mut self, actions: Vec<String>) -> Restore {
        let mut problems = Vec::new();
        for m in &self.d.mocks {
            match self.d.admin.get(&format!("{}/mock/faults", m.url)).await {
                Some(v) if v == m.baseline => {}
                Some(v) => problems.push(format!(
                    "backend {}: faults are {v}, not the start's",
                    m.name
                )),
                None => problems.push(format!("backend {}: /mock/faults did not answer", m.name)),
            }
        }
        if let Some(l) = self.d.local.as_mut() {
            for (id, alive) in l.alive() {
                if !alive {
                    problems.push(format!("node {id}: process is not running"));
                }
            }
        }
        for n in &self.d.nodes {
            let mut answered = false;
            for _ in 0..50 {
                if self.d.admin.sample(n.id, &n.admin).await.reachable {
                    answered = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if !answered {
                problems.push(format!("node {}: admin API does not answer", n.id));
            }
        }
        Restore {
            actions,
            verified: problems.is_empty(),
            problems,
        }
    }
}
