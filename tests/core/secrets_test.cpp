// What a run never writes (trainer/secrets.h): keys named like a secret, and the credentials of
// a URI, out of the config a run writes, status.json's messages and the log's lines.
#include "trainer/secrets.h"

#include <gtest/gtest.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

#include "trainer/config.h"
#include "trainer/logging.h"
#include "trainer/recipe.h"
#include "trainer/run_records.h"

namespace {

using trainer::is_secret_key;
using trainer::without_userinfo;

TEST(Secrets, KeysNamedLikeASecretAreKnownByTheirLastPart) {
  for (const char* key : {"plugins.x.password", "db_passwd", "plugins.x.api_key", "apiKey", "x.API-KEY", "hf_token",
                          "x.auth_token", "accessToken", "client_secret", "aws_secret_access_key", "x.credentials",
                          "private_key", "passphrase", "x.authorization"}) {
    EXPECT_TRUE(is_secret_key(key)) << key;
  }
  for (const char* key : {"dataset.tokenizer", "model.pad_token_id", "x.max_tokens", "plugins.mlflow.tracking_uri",
                          "training.batch_size", "token.x", "plugins.secret.name", "keyboard", "dataset.pad_token",
                          "x.eos_token", "mask_token", "special_token"}) {
    EXPECT_FALSE(is_secret_key(key)) << key;
  }
}

TEST(Secrets, AUrisUserinfoIsCutWhereverItIsInATextAndNothingElse) {
  EXPECT_EQ(without_userinfo("http://ana:pw@127.0.0.1:5000/x?y=1"), "http://127.0.0.1:5000/x?y=1");
  EXPECT_EQ(without_userinfo("https://tok@host"), "https://host");
  EXPECT_EQ(without_userinfo("tracking_uri = 'http://a:b@h:1' and \"s3+http://c:d@e/f\", then http://h/p@q"),
            "tracking_uri = 'http://h:1' and \"s3+http://e/f\", then http://h/p@q");
  for (const char* same : {"http://h:5000", "file:./mlruns", "ana@example.org", "://a@b", "no uri here", ""}) {
    EXPECT_EQ(without_userinfo(same), same);
  }
}

TEST(Secrets, AnOverrideShowsNoSecretValueAndNoUserinfo) {
  EXPECT_EQ(trainer::redacted_override("+plugins.x.api_token=\"t0k\""), "+plugins.x.api_token=(a secret, not shown)");
  EXPECT_EQ(trainer::redacted_override("plugins.mlflow.tracking_uri=\"http://a:pw@h\""),
            "plugins.mlflow.tracking_uri=\"http://h\"");
  EXPECT_EQ(trainer::redacted_override("model=cnn"), "model=cnn");
  // Where a config value came from is named in messages: without the secret.
  const trainer::Override o = trainer::parse_override("+plugins.x.password=\"pw\"");
  EXPECT_EQ(o.value, "\"pw\"");
  EXPECT_EQ(o.text.find("pw\""), std::string::npos) << o.text;
}

TEST(Secrets, TheConfigARunWritesHasNoSecretKeyAndNoUserinfo) {
  const trainer::Config cfg = trainer::Config::parse(R"(
[plugins.mlflow]
tracking_uri = "http://ana:pw@127.0.0.1:5000"
tags = ["a=http://u:p@h", "b=c"]
[plugins.other]
api_token = "t0k"
password = 7
[dataset]
tokenizer = "data/tok.json"
)");
  const trainer::Config written = trainer::redacted(cfg);
  EXPECT_EQ(written.get<std::string>("plugins.mlflow.tracking_uri"), "http://127.0.0.1:5000");
  EXPECT_EQ(written.get<std::vector<std::string>>("plugins.mlflow.tags"),
            (std::vector<std::string>{"a=http://h", "b=c"}));
  EXPECT_FALSE(written.has("plugins.other.api_token"));
  EXPECT_FALSE(written.has("plugins.other.password"));
  EXPECT_EQ(written.get<std::string>("dataset.tokenizer"), "data/tok.json");
  EXPECT_EQ(written.origin("plugins.mlflow.tracking_uri"), cfg.origin("plugins.mlflow.tracking_uri"));
  EXPECT_EQ(cfg.get<std::string>("plugins.other.api_token"), "t0k");  // the run's own config keeps them
  EXPECT_EQ(written.to_toml().find("pw"), std::string::npos) << written.to_toml();
}

// config.toml names each key it left out, in a comment (a TOML reader skips it), never its
// value; a resume reads the names back, and only names of that form: the file is data.
TEST(Secrets, AConfigTomlNamesTheSecretsItLeftOut) {
  const trainer::Config cfg = trainer::Config::parse(R"(
[plugins.other]
api_token = "t0k"
"odd\nkey_password" = "pw"
name = "x"
)");
  const std::string text = trainer::run_config_toml(cfg);
  EXPECT_EQ(text.find("t0k"), std::string::npos) << text;
  EXPECT_EQ(text.find("pw"), std::string::npos) << text;
  EXPECT_EQ(text.rfind("# plugins.other.api_token: left out (a secret); give it again on the command line: "
                       "plugins.other.api_token=VALUE\n",
                       0),
            0u)
      << text;
  EXPECT_EQ(text.find("odd"), std::string::npos) << text;  // a name with a line break is not written
  const trainer::Config back = trainer::Config::parse(text);
  EXPECT_EQ(back.get<std::string>("plugins.other.name"), "x");
  EXPECT_FALSE(back.has("plugins.other.api_token"));
  EXPECT_EQ(trainer::secrets_left_out(text), std::vector<std::string>{"plugins.other.api_token"});
  // Lines of another form, keys not named like a secret or not plain names: none.
  EXPECT_EQ(trainer::secrets_left_out("#plugins.x.token: left out (a secret)\n"
                                      "# training.lr: left out (a secret)\n"
                                      "# a b.token: left out (a secret)\n"
                                      "x = 1 # y.token: left out (a secret)\n"
                                      "# y.token: left out\n"),
            std::vector<std::string>{});
  EXPECT_EQ(trainer::secrets_left_out("# y.token: left out (a secret)\r\n# y.token: left out (a secret)"),
            std::vector<std::string>{"y.token"});
}

TEST(Secrets, StatusJsonAndTheLogCutAUrisUserinfo) {
  trainer::RunStatusRecord s;
  s.message = "plugins.mlflow: cannot reach http://ana:pw@127.0.0.1:9";
  EXPECT_EQ(trainer::encode_status(s).find("pw"), std::string::npos) << trainer::encode_status(s);
  std::ostringstream out;
  const auto log = trainer::default_logger();
  const auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  log->sinks().push_back(sink);
  log->warn("sent to {}", "http://ana:pw@127.0.0.1:9/api");
  log->sinks().pop_back();
  EXPECT_NE(out.str().find("sent to http://127.0.0.1:9/api"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("pw"), std::string::npos) << out.str();
}

}  // namespace
