//! `toolgate deny`, `undeny` and `denies`: set, clear and list emergency denies (the Controls
//! service). The operator is a JWT (`--token`) or, on a sidecar that allows dev identity,
//! `--as TENANT/SUBJECT`; `--tenant` and `--agent` narrow the deny, not who sets it.

use serde::Serialize;

use super::{
    ClientArgs, ControlArgs, Failure, IdentityArgs,
    client::{channel, request, status_error},
    print_json,
};
use crate::proto::{self, controls_client::ControlsClient};

impl ControlArgs {
    /// The client the verbs use: the operator's identity, the sidecar's address.
    fn client(&self) -> Result<ClientArgs, Failure> {
        let (tenant, subject) = match (&self.token, self.operator.as_deref()) {
            (Some(_), None) => (None, None),
            (_, operator) => {
                let operator = operator.unwrap_or("operator/cli");
                let (tenant, subject) = operator.split_once('/').ok_or_else(|| {
                    Failure::error(format_args!("--as {operator:?}: write TENANT/SUBJECT"))
                })?;
                (Some(tenant.to_owned()), Some(subject.to_owned()))
            }
        };
        Ok(ClientArgs {
            addr: self.addr.clone(),
            identity: IdentityArgs {
                tenant,
                subject,
                agent: None,
                scopes: None,
                token: self.token.clone(),
            },
            json: self.json,
        })
    }
}

/// `toolgate deny`.
pub(super) async fn deny(
    control: ControlArgs,
    ask: proto::SetEmergencyDenyRequest,
) -> Result<(), Failure> {
    let client = control.client()?;
    let mut grpc = ControlsClient::new(channel(&client).await?);
    let answer = grpc
        .set_emergency_deny(request(&client, ask)?)
        .await
        .map_err(status_error)?
        .into_inner();
    print(&client, &[answer.deny.unwrap_or_default()], "set")?;
    say_reach(&client, answer.shared);
    Ok(())
}

/// Where the denies hold: every sidecar sharing the Redis, or only the one asked. Not part of
/// `--json`'s list, so on stderr there.
fn say_reach(client: &ClientArgs, shared: bool) {
    let reach = match shared {
        true => "emergency denies set here hold on every sidecar sharing this one's Redis",
        false => {
            "emergency denies set here hold on this sidecar only: its state is in memory (with `state: redis`, on every sidecar sharing the Redis)"
        }
    };
    match client.json {
        true => eprintln!("{reach}"),
        false => println!("{reach}"),
    }
}

/// `toolgate undeny`.
pub(super) async fn undeny(control: ControlArgs, deny_id: String) -> Result<(), Failure> {
    let client = control.client()?;
    let mut grpc = ControlsClient::new(channel(&client).await?);
    let answer = grpc
        .clear_emergency_deny(request(
            &client,
            proto::ClearEmergencyDenyRequest { deny_id },
        )?)
        .await
        .map_err(status_error)?
        .into_inner();
    print(&client, &[answer.deny.unwrap_or_default()], "cleared")?;
    say_reach(&client, answer.shared);
    Ok(())
}

/// `toolgate denies`.
pub(super) async fn denies(control: ControlArgs) -> Result<(), Failure> {
    let client = control.client()?;
    let mut grpc = ControlsClient::new(channel(&client).await?);
    let answer = grpc
        .list_emergency_denies(request(&client, proto::ListEmergencyDeniesRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if answer.denies.is_empty() && !client.json {
        println!("no emergency denies in force");
    } else {
        print(&client, &answer.denies, "in force")?;
    }
    say_reach(&client, answer.shared);
    Ok(())
}

fn print(client: &ClientArgs, denies: &[proto::EmergencyDeny], what: &str) -> Result<(), Failure> {
    if client.json {
        let denies: Vec<DenyJson> = denies.iter().map(DenyJson::of).collect();
        return print_json(&denies);
    }
    for d in denies {
        let whom = match (d.tenant.as_str(), d.agent.as_str()) {
            ("", "") => "every caller".to_owned(),
            (tenant, "") => format!("tenant {tenant}"),
            ("", agent) => format!("agent {agent}"),
            (tenant, agent) => format!("tenant {tenant}, agent {agent}"),
        };
        let until = match d.expires_at_unix_ms {
            0 => "until cleared".to_owned(),
            at => format!("until {}", time(at)),
        };
        let cancel = if d.cancel_running {
            ", running calls stopped"
        } else {
            ""
        };
        println!(
            "{} {what}: {} for {whom}, {until}{cancel} (set by {} at {}): {}",
            d.deny_id,
            d.tools,
            d.set_by,
            time(d.set_at_unix_ms),
            d.reason
        );
    }
    Ok(())
}

fn time(unix_ms: i64) -> String {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[derive(Serialize)]
struct DenyJson<'a> {
    deny_id: &'a str,
    tools: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    tenant: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    agent: &'a str,
    reason: &'a str,
    set_by: &'a str,
    set_at_unix_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_unix_ms: Option<i64>,
    cancel_running: bool,
}

impl<'a> DenyJson<'a> {
    fn of(d: &'a proto::EmergencyDeny) -> Self {
        DenyJson {
            deny_id: &d.deny_id,
            tools: &d.tools,
            tenant: &d.tenant,
            agent: &d.agent,
            reason: &d.reason,
            set_by: &d.set_by,
            set_at_unix_ms: d.set_at_unix_ms,
            expires_at_unix_ms: Some(d.expires_at_unix_ms).filter(|&at| at > 0),
            cancel_running: d.cancel_running,
        }
    }
}
