"""Any sender: optional token, basic auth or HMAC, with the id taken from a header or JSON field."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import field_validator, model_validator

from service.sources.base import (
    Message,
    Messages,
    RawDelivery,
    Unauthenticated,
    authorization,
    constant_time_equal,
    first_header,
    parse_json,
    raw_header_name,
    require_json_media_type,
)
from service.sources.body_hmac import BodyHmacConfig, BodyHmacSource, body_signature
from service.sources.config import Secret, is_set, secret_text
from service.sources.jsonpointer import resolve_pointer, validate_pointer
from service.sources.limits import checked_event_type, checked_header_name, checked_message_id


class GenericConfig(BodyHmacConfig):
    id_header: str | None = None
    id_json_pointer: str | None = None
    id_fallback: Literal["body-sha256"] | None = None
    event_type_header: str | None = None
    event_type_json_pointer: str | None = None
    basic_auth: Secret | None = None

    @field_validator("id_json_pointer", "event_type_json_pointer")
    @classmethod
    def _pointer(cls, value: str | None) -> str | None:
        return None if value is None else validate_pointer(value)

    @field_validator("id_header", "event_type_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        return None if value is None else checked_header_name(value)

    @field_validator("basic_auth")
    @classmethod
    def _user_colon_password(cls, value: Any) -> Any:
        if is_set(value) and ":" not in value.get_secret_value():
            raise ValueError("basic_auth is 'user:password'")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> GenericConfig:
        if not (self.id_header or self.id_json_pointer or self.id_fallback):
            raise ValueError(
                "generic needs id_header, id_json_pointer or id_fallback = 'body-sha256'"
            )
        return self


class GenericSource(BodyHmacSource[GenericConfig]):
    kind = "generic"
    redelivery_days = 3.0

    def __init__(self, name: str, config: GenericConfig) -> None:
        super().__init__(name, config)
        # What `verify` reads of the config on every delivery, read once (see `Source`).
        self._needs_json = bool(config.id_json_pointer or config.event_type_json_pointer)
        # Header names as the raw header list holds them (lowercase bytes), for `first_header`.
        self._id_header = raw_header_name(config.id_header) if config.id_header else None
        self._event_type_header = (
            raw_header_name(config.event_type_header) if config.event_type_header else None
        )
        self._event_type_where = f"the {config.event_type_header} header"
        self._event_type_json_pointer = config.event_type_json_pointer
        # Where a refused message id was looked for, as its 400 says.
        self._id_where = " or ".join(
            [f"the {config.id_header} header"] * bool(config.id_header)
            + [f"the JSON field {config.id_json_pointer}"] * (config.id_json_pointer is not None)
        )

    def start_warning(self) -> str | None:
        config = self.config
        if config.hmac is None and config.basic_auth is None and config.token is None:
            return "accepts unsigned deliveries: it has no [hmac], basic_auth or token"
        return None

    @cached_property
    def _basic_auth(self) -> str | None:
        return secret_text(self.config.basic_auth)

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self._basic_auth is not None:
            self._check_basic_auth(delivery, self._basic_auth)
        if self._body_hmac is not None:
            self._body_hmac.check(delivery)

        payload: Any = None
        if self._needs_json:
            require_json_media_type(delivery)
            payload = parse_json(delivery.body)

        message_id = self._message_id(delivery, payload)
        return Messages([Message(message_id, self._event_type(delivery, payload))])

    def _event_type(self, delivery: RawDelivery, payload: Any) -> str | None:
        header = self._event_type_header
        if header is not None:
            value = first_header(delivery.raw_headers, header)
            return checked_event_type(value, self._event_type_where)
        pointer = self._event_type_json_pointer
        if pointer is None:
            return None
        value = resolve_pointer(payload, pointer)
        if isinstance(value, int | float | bool):
            value = json.dumps(value)  # a numeric type code is still a type
        return checked_event_type(value, f"the JSON field {pointer}")

    def _message_id(self, delivery: RawDelivery, payload: Any) -> str:
        header = self._id_header
        value = first_header(delivery.raw_headers, header) if header is not None else None
        config = self.config  # below, only when the header gave no id
        if not value and config.id_json_pointer is not None:
            value = resolve_pointer(payload, config.id_json_pointer)
        if (value is None or value == "") and config.id_fallback == "body-sha256":
            return "sha256:" + hashlib.sha256(delivery.body).hexdigest()
        return checked_message_id(value, self._id_where)

    @staticmethod
    def _check_basic_auth(delivery: RawDelivery, expected: str) -> None:
        scheme, encoded = authorization(delivery)
        if scheme.lower() != "basic" or not encoded:
            raise Unauthenticated("missing Basic authorization")
        try:
            offered = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise Unauthenticated("malformed Basic authorization") from None
        if not constant_time_equal(offered, expected.encode()):
            raise Unauthenticated("Basic credentials do not match")

    def example_curl(self, base_url: str) -> str | None:
        config = self.config
        body = {"id": "evt_demo_1", "type": "demo.created", "data": {"hello": "world"}}
        raw = json.dumps(body).encode()
        headers: dict[str, str] = {}
        if config.id_header:
            headers[config.id_header] = "evt_demo_1"
        if config.event_type_header:
            headers[config.event_type_header] = "demo.created"
        if config.hmac is not None:
            sig = body_signature(config.secret_values()[0], raw, config.hmac)
            headers[config.hmac.header] = f"{config.hmac.prefix}{sig}"
        if config.basic_auth is not None or config.token is not None:
            return None  # would print a credential on the console
        return self.curl_json(base_url, headers, raw.decode())
