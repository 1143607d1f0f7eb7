"""Structured output as a client checks it: the official SDK's parse() with pydantic models
(JSON schemas, strict) and JSON mode, streamed and not. Shared by each model's tests."""

from __future__ import annotations

import json
from typing import Literal

from openai import OpenAI
from pydantic import BaseModel, Field


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population: int
    capital: bool


class Pet(BaseModel):
    kind: Literal["cat", "dog", "bird"]
    legs: int


class Ingredient(BaseModel):
    name: str = Field(max_length=20)
    grams: int


class Recipe(BaseModel):  # nested objects in a bounded list
    title: str = Field(max_length=30)
    ingredients: list[Ingredient] = Field(min_length=1, max_length=3)
    vegetarian: bool


QUESTIONS = (
    (City, "Describe Paris: its name, country, population and whether it is a capital."),
    (Pet, "Describe a cat: its kind and how many legs it has."),
    (Recipe, "Give a short recipe for pancakes: a title, up to three ingredients with their "
             "weight in grams, and whether it is vegetarian."),
)


def assert_structured_output(client: OpenAI, model: str, both_ways: bool = True) -> None:
    """The reply is held to the grammar token by token, so it parses on any CPU; bounded
    strings and lists keep it within max_tokens whatever the model says. Each schema whole and
    streamed; with both_ways False, each one way, alternately (whole, streamed, whole)."""
    for n, (schema, question) in enumerate(QUESTIONS):
        if both_ways or n % 2 == 0:
            parsed = client.chat.completions.parse(
                model=model, messages=[{"role": "user", "content": question}],
                response_format=schema, temperature=0, max_tokens=200)
            choice = parsed.choices[0]
            assert choice.finish_reason == "stop", choice
            assert isinstance(choice.message.parsed, schema), choice.message.content
        if not (both_ways or n % 2 == 1):
            continue
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(
                               model=model, messages=[{"role": "user", "content": question}],
                               response_format={"type": "json_schema", "json_schema": {
                                   "name": schema.__name__, "strict": True,
                                   "schema": schema.model_json_schema()}},
                               temperature=0, max_tokens=200, stream=True) if c.choices)
        schema.model_validate_json(streamed)
    whole = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give the capital of Italy as a "
                                                         "JSON object."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=60)
    if whole.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(whole.choices[0].message.content), dict)
    else:  # cut at max_tokens, as OpenAI's JSON mode can be: still JSON as far as it goes
        assert whole.choices[0].message.content.lstrip().startswith("{")
