#pragma once
// What a run never writes down: credentials. One list of what names a secret and one way to
// take secrets out, used by every writer of a run's files: config.toml and the checkpoints'
// copy of it, status.json, the log, and the MLflow and TensorBoard plugins (params, tags,
// journal, plugin state, hparams). Keys named like a secret are left out; the "user:password@"
// of every URI is cut. The functions are inline so that code that does not link the core (the
// MLflow client) uses the same ones.
#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/config.h"
#include "trainer/export.h"

namespace trainer {

/// True when the last part of the dotted `key` is named like a secret: it holds password,
/// passwd, passphrase, secret, credential, authorization, api key, private key or access key
/// (with or without `_` or `-` between the words, any case), or it ends in "token" ("hf_token",
/// "auth_token"; not "tokenizer", "max_tokens", "pad_token_id", nor a tokenizer's special tokens:
/// "pad_token", "eos_token", "mask_token", ...).
inline bool is_secret_key(std::string_view key) {
  const std::size_t dot = key.rfind('.');
  std::string name;  // the last part, lower case, without _ and -
  for (const char c : key.substr(dot == std::string_view::npos ? 0 : dot + 1)) {
    if (c != '_' && c != '-') name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  static constexpr std::array<std::string_view, 9> kSecretWords = {
      "password", "passwd", "passphrase", "secret", "credential", "apikey", "privatekey", "accesskey", "authorization"};
  const auto holds = [&](std::string_view w) { return name.find(w) != std::string::npos; };
  // A tokenizer's special tokens ("pad_token", "eos_token", ...) end in "token" but are text, and a
  // run that dropped them from its config.toml would resume with another tokenizer setting.
  static constexpr std::array<std::string_view, 11> kTextTokens = {"pad",  "eos",   "bos", "unk",     "sep",  "cls",
                                                                   "mask", "start", "end", "special", "added"};
  const std::string_view token = "token";
  const bool ends_in_token =
      name.size() >= token.size() && name.compare(name.size() - token.size(), token.size(), token) == 0;
  const bool text_token =
      ends_in_token && std::find(kTextTokens.begin(), kTextTokens.end(),
                                 std::string_view(name).substr(0, name.size() - token.size())) != kTextTokens.end();
  return (ends_in_token && !text_token) || std::any_of(kSecretWords.begin(), kSecretWords.end(), holds);
}

/// `text` with the userinfo of every URI in it cut: "http://user:pass@host:5000/x" is
/// "http://host:5000/x", also inside a longer text (a message, a list).
inline std::string without_userinfo(std::string_view text) {
  std::string out;
  std::size_t done = 0;
  for (std::size_t sep = text.find("://"); sep != std::string_view::npos; sep = text.find("://", sep + 3)) {
    std::size_t scheme = sep;  // a scheme: a letter, then letters, digits, + - .
    while (scheme > 0 && (std::isalnum(static_cast<unsigned char>(text[scheme - 1])) != 0 || text[scheme - 1] == '+' ||
                          text[scheme - 1] == '-' || text[scheme - 1] == '.')) {
      --scheme;
    }
    if (scheme == sep || std::isalpha(static_cast<unsigned char>(text[scheme])) == 0) continue;
    const std::size_t host = sep + 3;
    std::size_t end = host;  // the authority ends at a path, query, fragment, blank or quote
    while (end < text.size() && std::string_view("/?#\"'<> \t\r\n").find(text[end]) == std::string_view::npos) ++end;
    const std::size_t at = text.substr(host, end - host).rfind('@');
    if (at == std::string_view::npos) continue;
    out.append(text.substr(done, host - done));
    done = host + at + 1;
  }
  out.append(text.substr(done));
  return out;
}

/// A command-line override (`a.b=1`, `+a.b="x"`) as it may be shown or written: one whose key
/// is named like a secret keeps its key only ("plugins.x.token=(a secret, not shown)"), any other
/// loses its URIs' userinfo.
inline std::string redacted_override(std::string_view text) {
  const std::size_t eq = text.find('=');
  std::string_view key = text.substr(0, eq);
  if (!key.empty() && key.front() == '+') key.remove_prefix(1);
  if (eq != std::string_view::npos && is_secret_key(key)) {
    return std::string(text.substr(0, eq + 1)) + "(a secret, not shown)";
  }
  return without_userinfo(text);
}

/// `cfg` as a run writes it anywhere: keys named like a secret (is_secret_key) left out, and
/// userinfo cut from every string (without_userinfo). A deep copy: `cfg` is unchanged.
TRAINER_API Config redacted(const Config& cfg);

/// A run directory's config.toml, as the run writes it: redacted(cfg) as TOML, opened by one
/// comment line for each key left out as a secret,
///   # plugins.mlflow.api_key: left out (a secret); give it again on the command line: plugins.mlflow.api_key=VALUE
/// so that a resume from it (`--resume RUN_DIR`) says what it runs without (secrets_left_out).
/// Never a `defaults` key: the config is the resolved one, its groups merged.
TRAINER_API std::string run_config_toml(const Config& cfg);

/// The keys a config.toml's comment lines (run_config_toml) say were left out as secrets, in
/// order, each once. Only lines of that form count, and only keys that are dotted names
/// (letters, digits, '_', '-') named like a secret: the file is data, and the names are shown.
TRAINER_API std::vector<std::string> secrets_left_out(std::string_view config_toml);

}  // namespace trainer
