//! `GET /openapi.json`: the API described from the handlers' own annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The OpenAPI document of the tenant API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "verdict",
        description = "Exactly-once trust decisions for identity-risk signals. Errors are \
                       application/problem+json (RFC 9457)."
    ),
    paths(
        super::signals::post_signal,
        super::events::list,
        super::events::show,
        super::events::subject,
        super::playbook::show,
        super::playbook::replace,
        super::deliveries::list,
        super::deliveries::show,
        super::deliveries::redeliver,
    ),
    modifiers(&ApiKey),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// Every `/v1` endpoint takes the tenant's API key as a bearer token.
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Serves the document.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
