//! `PUT`, `GET` and `DELETE /v1/endpoints/{name}` and `GET /v1/endpoints`: an admin key
//! manages its tenant's callback endpoints. Secrets are never returned; a new endpoint's
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
use crate::domain::EndpointName;
use crate::endpoints::{self, EndpointSpec, EndpointView, MAX_SPEC_BYTES, SetEndpoint};
use crate::problem::Problem;
use crate::store::Scope;

/// The tenant's endpoints, by name.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EndpointList {
    data: Vec<EndpointView>,
}

/// An endpoint name from the path; anything else is no endpoint.
fn name(text: &str) -> Result<EndpointName, ApiError> {
    text.parse().map_err(|_| ApiError::NotFound)
}

/// `PUT /v1/endpoints/{name}`: creates (201) or replaces (200) a callback endpoint.
#[utoipa::path(put, path = "/v1/endpoints/{name}", operation_id = "set_endpoint",
    tag = "endpoints",
    params(("name" = String, Path, pattern = r"^[a-z][a-z0-9_-]{0,63}$",
        description = "1 to 64 of a-z, 0-9, `_`, `-`, starting with a letter; `default` is the tenant's callback URL")),
    request_body(content = EndpointSpec, content_type = "application/json"),
    responses((status = 201, body = SetEndpoint, description = "Created; its signing secret is shown this once"),
        (status = 200, body = SetEndpoint, description = "Replaced"),
        (status = 400, body = Problem, description = "Invalid endpoint"),
        (status = 413, body = Problem, description = "The body is larger than 4096 bytes"),
        (status = 422, body = Problem, description = "The tenant has the most endpoints it may have")))]
pub async fn set(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<SetEndpoint>), ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    if body.len() > MAX_SPEC_BYTES {
        return Err(ApiError::TooLarge(MAX_SPEC_BYTES));
    }
    let name: EndpointName = name_text
        .parse()
        .map_err(|e: crate::domain::InvalidEndpointName| ApiError::Invalid(e.to_string()))?;
    let spec: EndpointSpec = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Invalid(format!("the body is not an endpoint: {e}")))?;
    let policy = app.deliverer.settings().destinations;
    let set = endpoints::set(&*app.store, &app.keys, tenant.id, name, spec, policy).await?;
    let status = if set.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(set)))
}

/// `GET /v1/endpoints`: the tenant's endpoints, never their secrets.
#[utoipa::path(get, path = "/v1/endpoints", operation_id = "list_endpoints",
    tag = "endpoints",
    responses((status = 200, body = EndpointList, description = "OK")))]
pub async fn list(
    State(app): State<AppState>,
    auth: Authenticated,
) -> Result<Json<EndpointList>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let data = endpoints::list(&*app.store, tenant.id).await?;
    Ok(Json(EndpointList { data }))
}

/// `GET /v1/endpoints/{name}`: one endpoint, never its secret.
#[utoipa::path(get, path = "/v1/endpoints/{name}", operation_id = "show_endpoint",
    tag = "endpoints",
    params(("name" = String, Path, description = "The endpoint's name")),
    responses((status = 200, body = EndpointView, description = "OK"),
        (status = 404, body = Problem, description = "Not found")))]
pub async fn show(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
) -> Result<Json<EndpointView>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let view = endpoints::show(&*app.store, tenant.id, &name(&name_text)?).await?;
    Ok(Json(view))
}

/// `DELETE /v1/endpoints/{name}`: deletes an endpoint. Its callbacks not yet sent fail when
/// attempted, saying there is no endpoint.
#[utoipa::path(delete, path = "/v1/endpoints/{name}", operation_id = "delete_endpoint",
    tag = "endpoints",
    params(("name" = String, Path, description = "The endpoint's name")),
    responses((status = 204, description = "Deleted"),
        (status = 404, body = Problem, description = "Not found")))]
pub async fn delete(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(name_text): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    endpoints::delete(&*app.store, tenant.id, &name(&name_text)?).await?;
    Ok(StatusCode::NO_CONTENT)
}
