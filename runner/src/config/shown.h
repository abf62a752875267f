// What of the config may be shown where people and files see it (the log, config.json, a
// manifest, a logged command line): notify.url is a webhook's password (Slack's and Discord's
// URLs are), so it is shown only as kHiddenUrl.
#pragma once

#include <string>

namespace gpurun {

inline constexpr const char* kHiddenUrl = "(set, not shown)";

/// notify.url as it may be shown: "" and $NAME (the name of an environment variable) as they
/// are, any URL as kHiddenUrl.
std::string shown_url(const std::string& url);

/// A command-line argument as it may be logged: a "notify.url=URL" in it (a --set's value) with
/// the URL shown as shown_url() shows it; any other argument unchanged.
std::string shown_argument(const std::string& arg);

}  // namespace gpurun
