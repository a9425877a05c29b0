//! The OpenAPI document lists exactly the router's routes, and every example in it
//! validates against its schema.
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tenax_server::ROUTES;

use crate::support::*;

#[tokio::test]
async fn every_route_is_documented_and_every_documented_route_exists() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let app = app(h.storage.clone(), config());
    let answer = call(&app, Method::GET, "/openapi.json", None, None).await;
    assert_eq!(answer.status, StatusCode::OK);
    let doc = answer.body;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for route in ROUTES {
        let op = &paths
            .get(route.path)
            .unwrap_or_else(|| panic!("{} is not in the document", route.path))
            [route.method.to_lowercase()];
        assert!(
            op.is_object(),
            "{} {} is not in the document",
            route.method,
            route.path
        );
        if route.access != tenax_server::Access::Open {
            assert_eq!(
                op["security"],
                json!([{"bearer": []}]),
                "{} {} documents no token",
                route.method,
                route.path
            );
        }
    }
    let mut documented = 0;
    for (path, item) in paths {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                documented += 1;
                assert!(
                    ROUTES
                        .iter()
                        .any(|r| r.path == path && r.method.to_lowercase() == method),
                    "{method} {path} is documented but not in the route table"
                );
                // ... and the router serves it (anything but 404/405 without a token).
                let uri = path
                    .replace("{id}", "1")
                    .replace("{task_no}", "x")
                    .replace("{name}", "x")
                    .replace("{command_type}", "x");
                let answer = call(
                    &app,
                    Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    &uri,
                    None,
                    None,
                )
                .await;
                assert!(
                    answer.status != StatusCode::NOT_FOUND
                        && answer.status != StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}: {}",
                    answer.status
                );
            }
        }
    }
    assert_eq!(documented, ROUTES.len());
    // The dashboard's routes are served but are not part of the JSON API's document.
    for route in tenax_server::DASHBOARD_ROUTES {
        assert!(
            !ROUTES.iter().any(|r| r.path == route.path),
            "{} is in both tables",
            route.path
        );
        assert!(
            paths.get(route.path).is_none(),
            "{} is documented as JSON API",
            route.path
        );
        let uri = route.path.replace("{id}", "1");
        let response = tower::ServiceExt::oneshot(
            app.clone(),
            request(
                Method::from_bytes(route.method.as_bytes()).unwrap(),
                &uri,
                Some(ADMIN),
                None,
            ),
        )
        .await
        .unwrap();
        assert!(
            response.status() != StatusCode::METHOD_NOT_ALLOWED
                && (response.status() != StatusCode::NOT_FOUND || uri.ends_with("/1")),
            "{} {}: {}",
            route.method,
            route.path,
            response.status()
        );
    }
}

/// Every `example` in the document, with the schema it belongs to.
fn examples(value: &Value, pointer: String, found: &mut Vec<(String, Value, Value)>) {
    match value {
        Value::Object(map) => {
            if let Some(example) = map.get("example") {
                let schema = map.get("schema").cloned().unwrap_or_else(|| {
                    let mut schema = map.clone();
                    schema.remove("example");
                    Value::Object(schema)
                });
                found.push((pointer.clone(), schema, example.clone()));
            }
            if let Some(Value::Array(list)) = map.get("examples") {
                for example in list {
                    let mut schema = map.clone();
                    schema.remove("examples");
                    found.push((pointer.clone(), Value::Object(schema), example.clone()));
                }
            }
            for (key, child) in map {
                if key != "example" && key != "examples" {
                    examples(child, format!("{pointer}/{key}"), found);
                }
            }
        }
        Value::Array(list) => {
            for (i, child) in list.iter().enumerate() {
                examples(child, format!("{pointer}/{i}"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_example_validates_against_its_schema() {
    let doc = serde_json::to_value(tenax_server::openapi()).unwrap();
    let mut found = Vec::new();
    examples(&doc, String::new(), &mut found);
    assert!(found.len() >= 10, "only {} examples", found.len());
    for (pointer, schema, example) in &found {
        // The schema sits in a document that holds the components, so its references
        // resolve.
        let mut root = schema.clone();
        if let Value::Object(map) = &mut root {
            map.insert("components".to_owned(), doc["components"].clone());
        }
        let validator = jsonschema::validator_for(&root)
            .unwrap_or_else(|e| panic!("{pointer}: the schema does not compile: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(example)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{pointer}: example {example} does not validate: {errors:?}"
        );
    }
    // The checker can fail: a wrong example is caught.
    let task =
        json!({"$ref": "#/components/schemas/TaskView", "components": doc["components"].clone()});
    let validator = jsonschema::validator_for(&task).unwrap();
    assert!(!validator.is_valid(&json!({"id": "forty-two"})));
}

#[tokio::test]
async fn the_error_schema_has_an_optional_field() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let app = app(h.storage.clone(), config());
    let doc = call(&app, Method::GET, "/openapi.json", None, None)
        .await
        .body;
    let detail = &doc["components"]["schemas"]["ErrorDetail"];
    assert!(
        detail["properties"]["field"].is_object(),
        "ErrorDetail documents no field: {detail}"
    );
    let required: Vec<&str> = detail["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        required.contains(&"code") && required.contains(&"message"),
        "{detail}"
    );
    assert!(
        !required.contains(&"field"),
        "field must be optional: {detail}"
    );
}
