//! A2A push notification configs (issue 52): `CreateTaskPushNotificationConfig`, `Get...`,
//! `List...`, `Delete...` (0.3: `tasks/pushNotificationConfig/{set,get,list,delete}`), and a
//! send's `configuration.taskPushNotificationConfig`. A config is kept in the store with its
//! task; each task state change a stream shows (`working`, `input-required`, `completed`,
//! `failed`, `canceled`) is posted to each config through the webhooks' outbox (durable, signed,
//! retried), its body a `StreamResponse` ([`delivery`]; 0.3's task for a config made through a
//! 0.3 method), with the config's token as `X-A2A-Notification-Token` and its `authentication`
//! as `Authorization`.
//!
//! A config's URL passes the webhooks' own check (`FABRIC_WEBHOOK_ALLOWED_ORIGINS`), and may
//! carry no credentials (they belong in `authentication`). Its token and credentials are
//! secrets: shown only by the methods that return the config, as A2A defines them.

use serde_json::{Value, json};

use super::super::{AppState, store_error};
use super::task::{self, api};
use super::wire::{Code, RpcError};
use crate::store::StoredRun;
use crate::store::push::{PushAuth, PushConfig, PushConfigStore};

/// What a config method does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Create,
    Get,
    List,
    Delete,
}

/// The longest config id, and the longest token or credentials, a config may have.
const MAX_ID: usize = 256;
const MAX_SECRET: usize = 4096;

/// A config as a client gave it, checked, before its task is known.
pub(super) struct Given {
    id: Option<String>,
    url: String,
    token: Option<String>,
    auth: Option<PushAuth>,
}

fn store(state: &AppState) -> Result<&dyn PushConfigStore, RpcError> {
    state.inner.durable.store().push_configs().ok_or_else(|| RpcError::new(Code::Internal, "this store keeps no push notification configs"))
}

/// A string field: absent, `null` or `""` is `None`; another type is invalid params.
fn text<'v>(v: &'v Value, field: &str) -> Result<Option<&'v str>, RpcError> {
    super::params::text(v, field, "params")
}

/// A secret that goes into a header: printable ASCII, bounded. Never echoed.
fn secret(v: &Value, field: &str) -> Result<Option<String>, RpcError> {
    match text(v, field)?.filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) if s.len() <= MAX_SECRET && s.bytes().all(|b| (0x20..0x7f).contains(&b)) => Ok(Some(s.to_owned())),
        Some(_) => Err(RpcError::params(format!("`{field}` must be printable ASCII of at most {MAX_SECRET} bytes"))),
    }
}

/// Reads a config: 1.0's `TaskPushNotificationConfig` (`authentication.scheme`) or 0.3's
/// `PushNotificationConfig` (`authentication.schemes`), its URL checked as a webhook's is.
fn given(state: &AppState, v: &Value) -> Result<Given, RpcError> {
    if !v.is_object() {
        return Err(RpcError::params("a push notification config must be an object"));
    }
    let id = match text(v, "id")?.filter(|s| !s.is_empty()) {
        Some(id) if id.len() > MAX_ID || id.chars().any(char::is_control) => {
            return Err(RpcError::params(format!("a config `id` must be at most {MAX_ID} bytes, without control characters")));
        }
        id => id.map(str::to_owned),
    };
    let Some(text_url) = text(v, "url")? else { return Err(RpcError::params("a push notification config needs its `url`")) };
    if crate::config::web_url(text_url).is_some_and(|u| !u.username().is_empty() || u.password().is_some()) {
        return Err(RpcError::params("the `url` must not carry credentials: give them as `authentication`"));
    }
    let settings = &state.runtime().settings().service.webhooks;
    let url = settings.target(Some(text_url)).map_err(|e| RpcError::params(e.to_string().replace("`webhook_url`", "the push notification `url`")))?;
    let Some(url) = url else { return Err(RpcError::params("the push notification `url` is not one this fleet posts to")) };
    let auth = match v.get("authentication") {
        None | Some(Value::Null) => None,
        Some(a @ Value::Object(_)) => {
            let schemes: Vec<&str> = match (text(a, "scheme")?, a.get("schemes").and_then(Value::as_array)) {
                (Some(s), _) => vec![s],
                (None, Some(list)) => list.iter().filter_map(Value::as_str).collect(),
                (None, None) => Vec::new(),
            };
            let scheme = schemes.iter().find_map(|s| match s.to_ascii_lowercase().as_str() {
                "bearer" => Some("Bearer"),
                "basic" => Some("Basic"),
                _ => None,
            });
            match (scheme, schemes.is_empty()) {
                (Some(scheme), _) => Some(PushAuth { scheme: scheme.to_owned(), credentials: secret(a, "credentials")? }),
                (None, true) => None,
                (None, false) => return Err(RpcError::params("`authentication`: the schemes served are Bearer and Basic")),
            }
        }
        Some(_) => return Err(RpcError::params("`authentication` must be an object")),
    };
    Ok(Given { id, url, token: secret(v, "token")?, auth })
}

/// A send's config (`configuration.taskPushNotificationConfig`, 0.3's
/// `configuration.pushNotificationConfig`), checked.
pub(super) fn of_send(state: &AppState, params: &Value) -> Result<Option<Given>, RpcError> {
    let config = params.get("configuration");
    match config.and_then(|c| c.get("taskPushNotificationConfig").or_else(|| c.get("pushNotificationConfig"))) {
        None | Some(Value::Null) => Ok(None),
        // An older 1.0 draft nested the config once more.
        Some(p) => given(state, p.get("pushNotificationConfig").filter(|c| c.is_object()).unwrap_or(p)).map(Some),
    }
}

/// Keeps a send's config for its task: without an id, the task's id is its id (as the SDKs'
/// servers do), so a repeated send keeps no second config. The run exists already and may
/// have moved on: the state it is in now is delivered too, unless the writer did.
pub(super) async fn keep(state: &AppState, run_id: &str, given: Option<Given>, legacy: bool) -> Result<(), RpcError> {
    let Some(g) = given else { return Ok(()) };
    let config =
        PushConfig { run_id: run_id.to_owned(), config_id: g.id.unwrap_or_else(|| run_id.to_owned()), url: g.url, token: g.token, auth: g.auth, legacy };
    let configs = store(state)?;
    configs.put_push_config(&config).await.map_err(|e| api(store_error(e)))?;
    configs.push_catch_up(run_id, &config.config_id).await.map_err(|e| api(store_error(e)))?;
    state.wake_webhooks();
    Ok(())
}

/// A config as the method's version shows it: 1.0's flat `TaskPushNotificationConfig`, 0.3's
/// `{taskId, pushNotificationConfig}`.
fn shown(c: &PushConfig, legacy: bool) -> Value {
    let mut config = json!({"id": c.config_id, "url": c.url});
    if let Some(t) = &c.token {
        config["token"] = json!(t);
    }
    if let Some(a) = &c.auth {
        let mut auth = if legacy { json!({"schemes": [a.scheme]}) } else { json!({"scheme": a.scheme}) };
        if let Some(cr) = &a.credentials {
            auth["credentials"] = json!(cr);
        }
        config["authentication"] = auth;
    }
    if legacy {
        return json!({"taskId": c.run_id, "pushNotificationConfig": config});
    }
    config["taskId"] = json!(c.run_id);
    config
}

/// The task a request names: 1.0's `taskId` (the TCK also sends `task_id`), 0.3's `id` (its
/// `set` names it `taskId`).
fn task_param(params: &Value, op: Op, legacy: bool) -> Result<&str, RpcError> {
    let names: &[&str] = match (legacy, op) {
        (true, Op::Create) | (false, _) => &["taskId", "task_id"],
        (true, _) => &["id"],
    };
    names
        .iter()
        .find_map(|n| params.get(*n).and_then(Value::as_str))
        .ok_or_else(|| RpcError::params(format!("`params.{}` (the task id) is required", names[0])))
}

/// The config a get or delete names: 1.0's `id`, 0.3's `pushNotificationConfigId`.
fn config_param(params: &Value, legacy: bool) -> Result<Option<&str>, RpcError> {
    text(params, if legacy { "pushNotificationConfigId" } else { "id" })
}

fn no_config() -> RpcError {
    RpcError::new(Code::TaskNotFound, "no push notification config of this task has that id")
}

/// One config method on a task of `route_id` (another route's task, or none, is not found).
pub(super) async fn call(state: &AppState, route_id: &str, op: Op, params: &Value, legacy: bool) -> Result<Value, RpcError> {
    let run = task::load(state, route_id, task_param(params, op, legacy)?).await?;
    let configs = store(state)?;
    let failed = |e| api(store_error(e));
    match op {
        Op::Create => {
            let source =
                if legacy { params.get("pushNotificationConfig").unwrap_or(&Value::Null) } else { params.get("pushNotificationConfig").unwrap_or(params) };
            let g = given(state, source)?;
            let config_id = g.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let config = PushConfig { run_id: run.run_id, config_id, url: g.url, token: g.token, auth: g.auth, legacy };
            configs.put_push_config(&config).await.map_err(failed)?;
            Ok(shown(&config, legacy))
        }
        Op::Get => {
            let config = match config_param(params, legacy)?.filter(|c| !c.is_empty()) {
                Some(id) => configs.push_config(&run.run_id, id).await.map_err(failed)?,
                // 0.3 names none for a task's one config: its first.
                None if legacy => configs.list_push_configs(&run.run_id).await.map_err(failed)?.into_iter().next(),
                None => return Err(RpcError::params("`params.id` (the config id) is required")),
            };
            config.map(|c| shown(&c, legacy)).ok_or_else(no_config)
        }
        Op::List => {
            let list: Vec<Value> = configs.list_push_configs(&run.run_id).await.map_err(failed)?.iter().map(|c| shown(c, legacy)).collect();
            Ok(if legacy { json!(list) } else { json!({"configs": list, "nextPageToken": ""}) })
        }
        Op::Delete => {
            let Some(id) = config_param(params, legacy)?.filter(|c| !c.is_empty()) else {
                return Err(RpcError::params(format!("`params.{}` (the config id) is required", if legacy { "pushNotificationConfigId" } else { "id" })));
            };
            // Idempotent, as A2A says: a config deleted already is deleted.
            configs.delete_push_config(&run.run_id, id).await.map_err(failed)?;
            Ok(if legacy { Value::Null } else { json!({}) })
        }
    }
}

/// A delivery to a push config: its body (a `StreamResponse`: a status update for `working`
/// and `input-required`, the task with its artifact at its end; 0.3's task for a 0.3 config)
/// and its headers (the token, `Authorization`). `run` is the run as the state change left it.
pub(in crate::api) fn delivery(run: &StoredRun, config: &PushConfig) -> (Value, Vec<(&'static str, String)>) {
    let task = task::task_of(run, true);
    let body = if config.legacy {
        super::wire::legacy(json!({"task": task}))
    } else if run.status.is_pending() || run.status == crate::store::StoredStatus::AwaitingInput {
        let meta = json!({"fabric": {"event": format!("run.{}", run.status.as_str())}});
        json!({"statusUpdate": {"taskId": task["id"], "contextId": task["contextId"], "status": task["status"], "metadata": meta}})
    } else {
        json!({"task": task})
    };
    let mut headers = Vec::new();
    if let Some(t) = &config.token {
        headers.push(("x-a2a-notification-token", t.clone()));
    }
    if let Some(a) = &config.auth
        && let Some(c) = &a.credentials
    {
        headers.push(("authorization", format!("{} {c}", a.scheme)));
    }
    (body, headers)
}
