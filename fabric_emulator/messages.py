# ruff: noqa: E501  (registry texts are kept verbatim, one string each)
"""Redfish messages (``@Message.ExtendedInfo``) from the DMTF registries the service uses.

The definitions below are the registries' own (Base 1.19, Composition 1.1, TaskEvent 1.0):
MessageId, text, severity and resolution must match the published registries, which a
unit test checks against ``tests/data/redfish/registries``. Only the messages this service
emits are listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Registry prefix -> "major.minor" that goes into a MessageId.
VERSIONS: dict[str, str] = {"Base": "1.19", "Composition": "1.1", "TaskEvent": "1.0"}
# Registry prefix -> the full version of the registry file the texts come from.
FULL_VERSIONS: dict[str, str] = {"Base": "1.19.2", "Composition": "1.1.3", "TaskEvent": "1.0.5"}


@dataclass(frozen=True)
class _Def:
    message: str
    severity: str
    args: int
    resolution: str


MESSAGES: dict[tuple[str, str], _Def] = {
    ("Base", "Success"): _Def(
        "The request completed successfully.",
        "OK",
        0,
        "None.",
    ),
    ("Base", "GeneralError"): _Def(
        "A general error has occurred.  See Resolution for information on how to resolve the error, or @Message.ExtendedInfo if Resolution is not provided.",
        "Critical",
        0,
        "None.",
    ),
    ("Base", "PropertyUnknown"): _Def(
        "The property %1 is not in the list of valid properties for the resource.",
        "Warning",
        1,
        "Remove the unknown property from the request body and resubmit the request if the operation failed.",
    ),
    ("Base", "PropertyValueTypeError"): _Def(
        "The value '%1' for the property %2 is not a type that the property can accept.",
        "Warning",
        2,
        "Correct the value for the property in the request body and resubmit the request if the operation failed.",
    ),
    ("Base", "PropertyNotWritable"): _Def(
        "The property %1 is a read-only property and cannot be assigned a value.",
        "Warning",
        1,
        "Remove the property from the request body and resubmit the request if the operation failed.",
    ),
    ("Base", "PropertyMissing"): _Def(
        "The property %1 is a required property and must be included in the request.",
        "Warning",
        1,
        "Ensure that the property is in the request body and has a valid value and resubmit the request if the operation failed.",
    ),
    ("Base", "MalformedJSON"): _Def(
        "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
        "Critical",
        0,
        "Ensure that the request body is valid JSON and resubmit the request.",
    ),
    ("Base", "PayloadTooLarge"): _Def(
        "The supplied payload exceeds the maximum size supported by the service.",
        "Critical",
        0,
        "Check that the supplied payload is correct and supported by this service.",
    ),
    ("Base", "HeaderInvalid"): _Def(
        "Header '%1' is invalid.",
        "Critical",
        1,
        "Resubmit the request with a valid request header.",
    ),
    ("Base", "QueryParameterUnsupported"): _Def(
        "Query parameter '%1' is not supported.",
        "Warning",
        1,
        "Correct or remove the query parameter and resubmit the request.",
    ),
    ("Base", "QueryNotSupportedOnResource"): _Def(
        "Querying is not supported on the requested resource.",
        "Warning",
        0,
        "Remove the query parameters and resubmit the request if the operation failed.",
    ),
    ("Base", "QueryParameterOutOfRange"): _Def(
        "The value '%1' for the query parameter %2 is out of range %3.",
        "Warning",
        3,
        "Reduce the value for the query parameter to a value that is within range, such as a start or count value that is within bounds of the number of resources in a collection or a page number that is within the range of valid pages.",
    ),
    ("Base", "QueryParameterValueFormatError"): _Def(
        "The value '%1' for the parameter %2 is not a format that the parameter can accept.",
        "Warning",
        2,
        "Correct the value for the query parameter in the request and resubmit the request if the operation failed.",
    ),
    ("Base", "ActionNotSupported"): _Def(
        "The action %1 is not supported by the resource.",
        "Critical",
        1,
        "Check the Actions property in the resource for the supported actions.",
    ),
    ("Base", "ActionParameterMissing"): _Def(
        "The action %1 requires the parameter %2 to be present in the request body.",
        "Critical",
        2,
        "Supply the action with the required parameter in the request body when the request is resubmitted.",
    ),
    ("Base", "ActionParameterUnknown"): _Def(
        "The action %1 was submitted with the invalid parameter %2.",
        "Warning",
        2,
        "Correct the invalid action parameter and resubmit the request if the operation failed.",
    ),
    ("Base", "ActionParameterValueTypeError"): _Def(
        "The value '%1' for the parameter %2 in the action %3 is not a type that the parameter can accept.",
        "Warning",
        3,
        "Correct the value for the parameter in the request body and resubmit the request if the operation failed.",
    ),
    ("Base", "ResourceInUse"): _Def(
        "The change to the requested resource failed because the resource is in use or in transition.",
        "Warning",
        0,
        "Remove the condition and resubmit the request if the operation failed.",
    ),
    ("Base", "ResourceNotFound"): _Def(
        "The requested resource of type %1 named '%2' was not found.",
        "Critical",
        2,
        "Provide a valid resource identifier and resubmit the request.",
    ),
    ("Base", "ResourceCannotBeDeleted"): _Def(
        "The delete request failed because the resource requested cannot be deleted.",
        "Critical",
        0,
        "Do not attempt to delete a non-deletable resource.",
    ),
    ("Base", "NoValidSession"): _Def(
        "There is no valid session established with the implementation.",
        "Critical",
        0,
        "Establish a session before attempting any operations.",
    ),
    ("Base", "InsufficientPrivilege"): _Def(
        "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.",
        "Critical",
        0,
        "Either abandon the operation or change the associated access rights and resubmit the request if the operation failed.",
    ),
    ("Base", "InternalError"): _Def(
        "The request failed due to an internal service error.  The service is still operational.",
        "Critical",
        0,
        "Resubmit the request.  If the problem persists, consider resetting the service.",
    ),
    ("Base", "ServiceTemporarilyUnavailable"): _Def(
        "The service is temporarily unavailable.  Retry in %1 seconds.",
        "Critical",
        1,
        "Wait for the indicated retry duration and retry the operation.",
    ),
    ("Base", "PreconditionFailed"): _Def(
        "The ETag supplied did not match the ETag required to change this resource.",
        "Critical",
        0,
        "Try the operation again using the appropriate ETag.",
    ),
    ("Base", "PreconditionRequired"): _Def(
        "A precondition header or annotation is required to change this resource.",
        "Critical",
        0,
        "Try the operation again using an If-Match or If-None-Match header and appropriate ETag.",
    ),
    ("Base", "OperationNotAllowed"): _Def(
        "The HTTP method is not allowed on this resource.",
        "Critical",
        0,
        "None.",
    ),
    ("Base", "PropertyValueIncorrect"): _Def(
        "The property '%1' with the requested value of '%2' could not be written because the value does not meet the constraints of the implementation.",
        "Warning",
        2,
        "None.",
    ),
    ("Base", "NoOperation"): _Def(
        "The request body submitted contain no data to act upon and no changes to the resource took place.",
        "Warning",
        0,
        "Add properties in the JSON object and resubmit the request.",
    ),
    ("Base", "SessionTerminated"): _Def(
        "The session was successfully terminated.",
        "OK",
        0,
        "None.",
    ),
    ("Base", "ResourceMissingAtURI"): _Def(
        "The resource at the URI '%1' was not found.",
        "Critical",
        1,
        "Place a valid resource at the URI or correct the URI and resubmit the request.",
    ),
    ("Base", "OperationFailed"): _Def(
        "An error occurred internal to the service as part of the overall request.  Partial results may have been returned.",
        "Warning",
        0,
        "Resubmit the request.  If the problem persists, consider resetting the service or provider.",
    ),
    ("Composition", "ResourceBlockInUse"): _Def(
        "Resource block '%1' cannot be part of any new compositions.",
        "Warning",
        1,
        "Remove the resource block from the request and resubmit the request.",
    ),
    ("Composition", "ResourceBlockNotFound"): _Def(
        "Resource block '%1' was not found.",
        "Critical",
        1,
        "Remove the resource block and resubmit the request.",
    ),
    ("Composition", "ResourceBlockInvalid"): _Def(
        "Resource block '%1' is not valid.",
        "Critical",
        1,
        "Remove the resource block and resubmit the request.",
    ),
    ("Composition", "IncompatibleZone"): _Def(
        "The requested resource blocks span multiple resource zones.",
        "Critical",
        0,
        "Request resource blocks from the same resource zone.",
    ),
    ("Composition", "ResourceBlockCompositionStateChanged"): _Def(
        "The composition status of the resource block '%1' has changed.",
        "OK",
        1,
        "None.",
    ),
    ("TaskEvent", "TaskStarted"): _Def(
        "The task with Id '%1' has started.",
        "OK",
        1,
        "None.",
    ),
    ("TaskEvent", "TaskCompletedOK"): _Def(
        "The task with Id '%1' has completed.",
        "OK",
        1,
        "None.",
    ),
    ("TaskEvent", "TaskAborted"): _Def(
        "The task with Id '%1' has completed with errors.",
        "Critical",
        1,
        "None.",
    ),
}


def message_id(prefix: str, key: str) -> str:
    return f"{prefix}.{VERSIONS[prefix]}.{key}"


def message(
    prefix: str, key: str, *args: object, related: list[str] | None = None
) -> dict[str, Any]:
    """One ``Message`` object; ``args`` fill %1, %2, ... in the registry's text."""
    d = MESSAGES[(prefix, key)]
    if len(args) != d.args:
        raise ValueError(f"{prefix}.{key} takes {d.args} arguments, got {len(args)}")
    text = d.message
    for i, arg in enumerate(args, start=1):
        text = text.replace(f"%{i}", str(arg))
    out: dict[str, Any] = {
        "MessageId": message_id(prefix, key),
        "Message": text,
        "MessageArgs": [str(a) for a in args],
        "MessageSeverity": d.severity,
        "Resolution": d.resolution,
    }
    if related:
        out["RelatedProperties"] = related
    return out


def base(key: str, *args: object, related: list[str] | None = None) -> dict[str, Any]:
    return message("Base", key, *args, related=related)


def composition(key: str, *args: object) -> dict[str, Any]:
    return message("Composition", key, *args)


def error_body(*messages: dict[str, Any]) -> dict[str, Any]:
    """The Redfish error response: ``code``/``message`` from the first message, all in
    ``@Message.ExtendedInfo``. With several messages the code is Base.GeneralError."""
    if len(messages) == 1:
        code, text = messages[0]["MessageId"], messages[0]["Message"]
    else:
        general = base("GeneralError")
        code, text = general["MessageId"], general["Message"]
    return {"error": {"code": code, "message": text, "@Message.ExtendedInfo": list(messages)}}
