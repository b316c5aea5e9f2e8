//! `GET /openapi.json`: the API described from the handlers' own annotations.

use axum::Json;
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{
    HttpMethod, Operation, OperationBuilder, ParameterBuilder, ParameterIn, PathItem, PathsBuilder,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ArrayBuilder, Content, ObjectBuilder, Ref, RefOr, Required, Response, ResponseBuilder, Schema,
    Type,
};
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
        super::subjects::lookup,
        super::subjects::unlock,
        super::subjects::lift_deny,
        super::subjects::close_case,
        super::playbook::show,
        super::playbook::replace,
        super::playbook::simulate,
        super::deliveries::list,
        super::deliveries::show,
        super::deliveries::redeliver,
        super::deliveries::resolve,
        super::keys::create,
        super::keys::list,
        super::keys::revoke,
        super::connectors::set,
        super::connectors::list,
        super::connectors::show,
        super::connectors::delete,
        super::endpoints::set,
        super::endpoints::list,
        super::endpoints::show,
        super::endpoints::delete,
        super::feeds::post_set,
        super::feeds::post_camara_sim_swap,
        super::healthz,
        super::readyz,
        super::metrics,
        document,
    ),
    components(schemas(verdict_webhooks::Envelope, crate::connectors::request::ActionRequest)),
    modifiers(&ApiKey, &ProblemJson, &Links, &Webhooks),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// Every `/v1` endpoint takes the tenant's API key as a bearer token, and may answer 400 (a
/// malformed parameter), 401, 403 (the key's scope does not allow it), 429 (the tenant's rate
/// limit) and 503 (the database is unreachable).
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A tenant API key. Its scope decides what it may do: `ingest` sends \
                         signals, `read` the GET endpoints, `admin` everything.",
                    ))
                    .build(),
            ),
        );
        let retry_after = || Header::new(ObjectBuilder::new().schema_type(Type::Integer));
        let refusals: [(&str, Response); 5] = [
            (
                "400",
                problem_response("Invalid request: a malformed query string, path or header")
                    .build(),
            ),
            ("401", problem_response("Not authenticated").build()),
            (
                "403",
                problem_response("The API key's scope does not allow this request").build(),
            ),
            (
                "429",
                problem_response("Over the tenant's rate limit; retry after `Retry-After`")
                    .header("Retry-After", retry_after())
                    .build(),
            ),
            (
                "503",
                problem_response("The database is unreachable; retry after `Retry-After`")
                    .header("Retry-After", retry_after())
                    .build(),
            ),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for operation in operations(item) {
                for (status, response) in &refusals {
                    operation
                        .responses
                        .responses
                        .entry((*status).to_owned())
                        .or_insert_with(|| RefOr::T(response.clone()));
                }
            }
        }
    }
}

/// An annotation's `body = Problem` is documented by utoipa as `application/json`; the server
/// sends every problem as `application/problem+json` (RFC 9457), and so does the document.
struct ProblemJson;

impl Modify for ProblemJson {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let problem = Ref::from_schema_name("Problem");
        let is_problem = |content: &RefOr<Content>| matches!(content, RefOr::T(Content { schema: Some(RefOr::Ref(r)), .. }) if *r == problem);
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                for response in operation.responses.responses.values_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if response
                        .content
                        .get("application/json")
                        .is_some_and(is_problem)
                        && let Some(content) = response.content.shift_remove("application/json")
                    {
                        response
                            .content
                            .insert(crate::problem::PROBLEM_JSON.to_owned(), content);
                    }
                }
            }
        }
    }
}

/// OpenAPI links: where an id in one response is a path parameter of another operation. They
/// tell a client (and the stateful fuzzer in `tests/it/openapi_fuzz.rs`) how the operations
/// chain.
struct Links;

/// (from operation, status, link name, to operation, parameter, runtime expression).
#[rustfmt::skip]
const LINKS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("post_signal", "200", "GetEvent", "get_event", "id", "$response.body#/event_id"),
    ("post_signal", "200", "GetSubject", "get_subject", "subject_hash", "$response.body#/subject_hash"),
    ("list_events", "200", "GetEvent", "get_event", "id", "$response.body#/data/0/id"),
    ("get_event", "200", "GetSubject", "get_subject", "subject_hash", "$response.body#/subject_hash"),
    ("get_event", "200", "GetDelivery", "get_delivery", "id", "$response.body#/deliveries/0/id"),
    ("get_event", "200", "RedeliverDelivery", "redeliver_delivery", "id", "$response.body#/deliveries/0/id"),
    ("get_event", "200", "ResolveDelivery", "resolve_delivery", "id", "$response.body#/deliveries/0/id"),
    ("list_deliveries", "200", "GetDelivery", "get_delivery", "id", "$response.body#/data/0/id"),
    ("list_deliveries", "200", "RedeliverDelivery", "redeliver_delivery", "id", "$response.body#/data/0/id"),
    ("get_delivery", "200", "GetEvent", "get_event", "id", "$response.body#/event_id"),
    ("create_key", "201", "RevokeKey", "revoke_key", "key_id", "$response.body#/key_id"),
];

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                let Some(from) = operation.operation_id.clone() else {
                    continue;
                };
                for &(_, status, name, to, parameter, expression) in
                    LINKS.iter().filter(|link| link.0 == from)
                {
                    if let Some(RefOr::T(response)) = operation.responses.responses.get_mut(status)
                    {
                        response.links.insert(
                            name.to_owned(),
                            RefOr::T(
                                LinkBuilder::new()
                                    .operation_id(to)
                                    .parameter(parameter, expression)
                                    .build(),
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// What verdict sends: the decision callback and an `http` connector's action request, as
/// OpenAPI 3.1 `webhooks`, so a receiver can generate its types from the same document.
struct Webhooks;

impl Modify for Webhooks {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        type_envelope_actions(openapi);
        let decision = webhook(
            "decision",
            "A decision, to the tenant's callback URL",
            "Sent once per decided event, byte for byte the same on every attempt. `webhook-id` is \
             stable across retries and redeliveries: deduplicate on it.",
            "Envelope",
            &[],
        );
        let action_request = webhook(
            "action_request",
            "An action request, to an `http` connector",
            "Sent once per action bound to the connector, the same bytes and `Idempotency-Key` on \
             every attempt. 2xx is done; 409 (in progress), 429, 5xx, network errors and the \
             deadline are retried; any other 4xx is a terminal failure.",
            "ActionRequest",
            &[(
                "Idempotency-Key",
                "`<event_id>:<action>`, identical on every attempt (also the `webhook-id`)",
            )],
        );
        openapi.webhooks = Some(
            PathsBuilder::new()
                .path("decision", decision)
                .path("action_request", action_request)
                .build(),
        );
    }
}

/// The envelope's `actions` is free JSON to the webhooks crate; here it is what verdict puts
/// there: one `ActionResult` per action.
fn type_envelope_actions(openapi: &mut utoipa::openapi::OpenApi) {
    let Some(components) = openapi.components.as_mut() else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(envelope))) = components.schemas.get_mut("Envelope") {
        envelope.properties.insert(
            "actions".to_owned(),
            ArrayBuilder::new()
                .items(Ref::from_schema_name("ActionResult"))
                .description(Some("Each action and its outcome."))
                .into(),
        );
    }
}

/// A signed `POST` verdict makes, with its Standard Webhooks headers and `extra` ones.
fn webhook(
    id: &str,
    summary: &str,
    description: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> PathItem {
    let standard = [
        (
            verdict_webhooks::HEADER_ID,
            "The message id: deduplicate on it",
        ),
        (
            verdict_webhooks::HEADER_TIMESTAMP,
            "Unix seconds the attempt was signed at; refuse stale ones",
        ),
        (
            verdict_webhooks::HEADER_SIGNATURE,
            "Space-separated `v1,<base64 HMAC-SHA256>` over `{webhook-id}.{webhook-timestamp}.{body}`, \
             one per live secret during a rotation",
        ),
    ];
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let mut operation = OperationBuilder::new()
        .operation_id(Some(id))
        .summary(Some(summary))
        .description(Some(description))
        .tag("webhooks")
        .security(SecurityRequirement::default())
        .request_body(Some(
            RequestBodyBuilder::new()
                .content(
                    "application/json",
                    Content::new(Some(Ref::from_schema_name(body))),
                )
                .required(Some(Required::True))
                .build(),
        ))
        .response(
            "2XX",
            ResponseBuilder::new().description("Received; not sent again"),
        )
        .response(
            "default",
            ResponseBuilder::new()
                .description("Retried (5xx, 429, 409 for a connector) or failed (other 4xx)"),
        );
    for (name, description) in standard.into_iter().chain(extra.iter().copied()) {
        operation = operation.parameter(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(description))
                .schema(Some(string())),
        );
    }
    PathItem::new(HttpMethod::Post, operation)
}

/// Every operation of a path.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
    ]
    .into_iter()
    .flatten()
}

/// A problem+json response.
fn problem_response(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        crate::problem::PROBLEM_JSON,
        Content::new(Some(Ref::from_schema_name("Problem"))),
    )
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "operations", security(()),
    responses((status = 200, body = Object, description = "The OpenAPI 3.1 document")))]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
