//! `PUT`, `GET` and `DELETE /v1/connectors/{name}` and `GET /v1/connectors`: an admin key
//! manages its tenant's connectors. Credentials are never returned; a new HTTP connector's
//! signing secret is, once, in the answer that made it.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;

use super::auth::Authenticated;
use super::extract::Path;
use crate::app::AppState;
use crate::app::error::ApiError;
use crate::connectors::{self, ConnectorSpec, ConnectorView, SetConnector};
use crate::domain::ConnectorName;
use crate::problem::Problem;
use crate::store::Scope;

/// The tenant's connectors, by name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectorList {
    data: Vec<ConnectorView>,
}

/// A connector name from the path; anything else is no connector.
fn name(text: &str) -> Result<ConnectorName, ApiError> {
    text.parse().map_err(|_| ApiError::NotFound)
}

/// `PUT /v1/connectors/{name}`: creates (201) or replaces (200) a connector.
#[utoipa::path(put, path = "/v1/connectors/{name}", operation_id = "set_connector",
    tag = "connectors",
    params(("name" = String, Path, pattern = r"^[a-z][a-z0-9_-]{0,63}$",
        description = "1 to 64 of a-z, 0-9, `_`, `-`, starting with a letter")),
    request_body(content = ConnectorSpec, content_type = "application/json"),
    responses((status = 201, body = SetConnector, description = "Created; an HTTP connector's signing secret is shown this once"),
        (status = 200, body = SetConnector, description = "Replaced"),
        (status = 400, body = Problem, description = "Invalid connector"),
        (status = 422, body = Problem, description = "The tenant has the most connectors it may have")))]
pub async fn set(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<SetConnector>), ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let name: ConnectorName = name_text
        .parse()
        .map_err(|e: crate::domain::InvalidConnectorName| ApiError::Invalid(e.to_string()))?;
    let spec: ConnectorSpec = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Invalid(format!("the body is not a connector: {e}")))?;
    let policy = app.deliverer.settings().destinations;
    let set = connectors::set(&*app.store, &app.keys, tenant.id, name, spec, policy).await?;
    let status = if set.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(set)))
}

/// `GET /v1/connectors`: the tenant's connectors, never their credentials.
#[utoipa::path(get, path = "/v1/connectors", operation_id = "list_connectors",
    tag = "connectors",
    responses((status = 200, body = ConnectorList, description = "OK")))]
pub async fn list(
    State(app): State<AppState>,
    auth: Authenticated,
) -> Result<Json<ConnectorList>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let data = connectors::list(&*app.store, tenant.id).await?;
    Ok(Json(ConnectorList { data }))
}

/// `GET /v1/connectors/{name}`: one connector, never its credential.
#[utoipa::path(get, path = "/v1/connectors/{name}", operation_id = "show_connector",
    tag = "connectors",
    params(("name" = String, Path, description = "The connector's name")),
    responses((status = 200, body = ConnectorView, description = "OK"),
        (status = 404, body = Problem, description = "Not found")))]
pub async fn show(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
) -> Result<Json<ConnectorView>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let view = connectors::show(&*app.store, tenant.id, &name(&name_text)?).await?;
    Ok(Json(view))
}

/// `DELETE /v1/connectors/{name}`: deletes a connector. A playbook that binds an action to it
/// must be replaced first for new decisions to act; until then its actions fail, saying so.
#[utoipa::path(delete, path = "/v1/connectors/{name}", operation_id = "delete_connector",
    tag = "connectors",
    params(("name" = String, Path, description = "The connector's name")),
    responses((status = 204, description = "Deleted"),
        (status = 404, body = Problem, description = "Not found")))]
pub async fn delete(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    connectors::delete(&*app.store, tenant.id, &name(&name_text)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
