//! Accepting a run into the store: the start checks, its webhook URL, its session's policy
//! (`allow`, `reject`, `enqueue`, `interrupt`, decided by the store in one transaction), and an
//! idempotency key (a retry gets the key's run).

use std::sync::Arc;

use super::{AcceptError, AcceptedRun, Durable, Edition, StartRequest, Started};
use crate::config::SessionPolicy;
use crate::store::{IdempotencyKey, Keyed, NewRun, RunStore, SessionStart};

/// The longest `session_id`.
pub const MAX_SESSION_ID: usize = 1024;

/// What one create did: the run (new), or the key's run (a retry).
enum Made {
    New(AcceptedRun),
    Existing(Box<crate::store::StoredRun>),
}

impl Durable {
    /// Accepts a run: every start check, then a new run id and its row in the store. With
    /// `here`, the run is claimed by this process at once ([`Durable::execute`] runs it);
    /// without, it is `queued` for whichever process claims it first ([`Durable::claim_runs`]).
    /// Under a session policy (the contract's `multitask`, else `FABRIC_SESSION_POLICY`), a
    /// start whose session has a live run is refused (`reject`: [`AcceptError::SessionBusy`]) or
    /// queued behind it (`enqueue`; `interrupt`, which also requests the live runs' cancel, see
    /// [`AcceptedRun::interrupted`]).
    pub async fn accept(&self, req: &StartRequest, here: bool) -> Result<AcceptedRun, AcceptError> {
        self.made(self.create(req, here, None, true).await?)
    }

    /// [`Durable::accept`] of a run executed here by a process that sends no webhooks
    /// (`fabric run --store`): its ends are posted nowhere, whatever the fleet's URL.
    pub(super) async fn accept_here(&self, req: &StartRequest) -> Result<AcceptedRun, AcceptError> {
        self.made(self.create(req, true, None, false).await?)
    }

    fn made(&self, made: Made) -> Result<AcceptedRun, AcceptError> {
        match made {
            Made::New(run) => Ok(run),
            Made::Existing(_) => Err(AcceptError::Store(crate::store::StoreError::Database("a start without a key found an existing run".into()))),
        }
    }

    /// [`Durable::accept`] once per idempotency key: the first start with `key` accepts its run;
    /// any later one with the same start contract (compared as parsed, not as bytes) gets that
    /// run as it is now ([`Started::Replayed`]), on any process of the store; one with another
    /// contract is [`AcceptError::KeyReused`]. The store's constraint decides a race.
    pub async fn accept_once(&self, req: &StartRequest, here: bool, key: &IdempotencyKey) -> Result<Started, AcceptError> {
        self.keyed(req, here, key, true).await
    }

    /// [`Durable::accept_once`] of a run executed here by a process that sends no webhooks.
    pub(super) async fn accept_once_here(&self, req: &StartRequest, key: &IdempotencyKey) -> Result<Started, AcceptError> {
        self.keyed(req, true, key, false).await
    }

    async fn keyed(&self, req: &StartRequest, here: bool, key: &IdempotencyKey, hooks: bool) -> Result<Started, AcceptError> {
        let store = &self.store;
        // A retry is answered without the start checks: its run was accepted already (the
        // route may have gone since).
        let existing = match store.run_of_key(key).await? {
            Some(run) => run,
            None => match self.create(req, here, Some(key), hooks).await? {
                Made::New(run) => return Ok(Started::New(run)),
                Made::Existing(run) => *run,
            },
        };
        if !self.same_start(&existing.request, req) {
            return Err(AcceptError::KeyReused { run_id: existing.run_id });
        }
        Ok(Started::Replayed(Box::new(existing)))
    }

    /// Whether `req` is the start a key's run was accepted with (`stored`, its start contract):
    /// compared as the service acts on them, not as written.
    pub fn same_start(&self, stored: &StartRequest, req: &StartRequest) -> bool {
        self.as_acted_on(stored) == self.as_acted_on(req)
    }

    /// A start contract as the service acts on it, so that a retry written otherwise is the
    /// same start (issue 46): an empty `session_id` is none; `multitask` counts only with a
    /// session, and naming the fleet's own policy is not naming one; a `webhook_url` as the URL
    /// parser reads it (the scheme's case, blanks around it, `/./`).
    fn as_acted_on(&self, req: &StartRequest) -> StartRequest {
        let session_id = req.session_id.clone().filter(|s| !s.is_empty());
        let fleet = self.runtime.settings().service.session_policy;
        let multitask = req.multitask.filter(|p| session_id.is_some() && *p != fleet);
        let webhook_url = req.webhook_url.as_deref().map(|u| crate::config::web_url(u).map_or_else(|| u.to_owned(), |u| u.to_string()));
        StartRequest { session_id, multitask, webhook_url, ..req.clone() }
    }

    /// The start checks, then the run's row (or the key's run); with `hooks`, its webhook URL.
    async fn create(&self, req: &StartRequest, here: bool, key: Option<&IdempotencyKey>, hooks: bool) -> Result<Made, AcceptError> {
        let edition = self.runtime.current();
        let (store, webhook) = self.check_start(req, &edition)?;
        let webhook = webhook.filter(|_| hooks);
        // The version's sources are in the store before any run that records it.
        self.keep_version(&edition).await?;
        let run_id = edition.runner().new_id();
        let holder = here.then_some(&self.holder);
        // An empty session is none (a client's unset field, not one session of every client).
        let session = req.session_id.as_deref().filter(|s| !s.is_empty());
        let run = NewRun { webhook: webhook.as_deref(), session_id: session, catalogue_version: Some(edition.version()), ..NewRun::new(&run_id, req) };
        let policy = req.multitask.unwrap_or(self.runtime.settings().service.session_policy);
        let accepted = |lease, interrupted| Made::New(AcceptedRun { run_id: run_id.clone(), lease, interrupted, edition: edition.clone() });
        if let (Some(session), false) = (session, policy == SessionPolicy::Allow) {
            return match store.create_session_run(run, holder, policy, key).await? {
                SessionStart::Created { lease, interrupted } => Ok(accepted(lease, interrupted)),
                SessionStart::Busy { run_id } => Err(AcceptError::SessionBusy { session: session.to_owned(), run_id }),
                SessionStart::Existing(run) => Ok(Made::Existing(run)),
            };
        }
        match key {
            None => Ok(accepted(store.create_run(run, holder).await?, Vec::new())),
            Some(key) => match store.create_keyed_run(run, holder, key).await? {
                Keyed::Created(lease) => Ok(accepted(lease, Vec::new())),
                Keyed::Existing(run) => Ok(Made::Existing(run)),
            },
        }
    }

    /// Every start check; the store a run is accepted into, and where its ends are posted.
    pub(super) fn check_start(&self, req: &StartRequest, edition: &Edition) -> Result<(&Arc<dyn RunStore>, Option<String>), AcceptError> {
        let route = edition.check_route(&req.route_id)?;
        crate::exec::check_goal(route, &req.goal)?;
        if let Some(p) = &req.model_profile
            && !edition.catalogue().profiles().any(|(name, _)| name == p)
        {
            return Err(AcceptError::UnknownProfile(p.clone()));
        }
        if req.multitask.is_some_and(|p| p != SessionPolicy::Allow) && req.session_id.as_deref().is_none_or(str::is_empty) {
            return Err(AcceptError::BadSession("is needed with `multitask` (a policy applies to a session's runs)"));
        }
        if let Some(s) = &req.session_id {
            // A column of the store, which PostgreSQL cannot give a NUL.
            if s.contains('\0') {
                return Err(AcceptError::BadSession("must not hold a NUL"));
            }
            if s.len() > MAX_SESSION_ID {
                return Err(AcceptError::BadSession("is longer than 1024 bytes"));
            }
        }
        let webhook = self.runtime.settings().service.webhooks.target(req.webhook_url.as_deref())?;
        Ok((&self.store, webhook))
    }
}
