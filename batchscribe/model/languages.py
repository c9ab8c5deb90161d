"""Whisper's languages: ISO-style code -> lowercase English name, in the vocabulary's token order.

The order matters: a multilingual vocabulary holds one `<|code|>` token per entry, in this order,
right after `<|startoftranscript|>` (99 languages up to large-v2, 100 from large-v3 with `yue`).
The names are the ones the OpenAI API returns in `verbose_json` ("english", "german", ...).
"""

from __future__ import annotations

LANGUAGES: dict[str, str] = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak",
    "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian",
    "az": "azerbaijani", "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian",
    "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian", "ne": "nepali",
    "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan",
    "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati",
    "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese",
    "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese",
    "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala",
    "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}  # fmt: skip

# Other names users type for the same languages (accepted on input, never produced).
_ALIASES: dict[str, str] = {
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb",
    "pushto": "ps", "panjabi": "pa", "moldavian": "ro", "moldovan": "ro", "sinhalese": "si",
    "castilian": "es", "mandarin": "zh",
}  # fmt: skip

_BY_NAME: dict[str, str] = {**{name: code for code, name in LANGUAGES.items()}, **_ALIASES}


def language_name(code: str) -> str:
    """The lowercase English name for a Whisper language code, e.g. "en" -> "english"."""
    try:
        return LANGUAGES[code]
    except KeyError:
        raise ValueError(
            f"unknown language code {code!r}; use one of: {', '.join(LANGUAGES)}"
        ) from None


def language_code(language: str) -> str | None:
    """Normalise a code or an English name ("en", "English", "mandarin") to a code; None if unknown."""
    key = language.strip().lower()
    if key in LANGUAGES:
        return key
    return _BY_NAME.get(key)
