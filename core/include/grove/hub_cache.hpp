#pragma once
// Models named by their Hugging Face Hub id ("Qwen/Qwen2.5-0.5B-Instruct"), as TRL users name them,
// found in the local cache that `hf download`, transformers and TRL fill. Grove downloads nothing:
// it reads the cache as huggingface_hub lays it out, offline.
#include <optional>
#include <string>

namespace grove {

// The cache folder huggingface_hub uses: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else
// $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
std::string hub_cache_directory();

// Whether `text` has the shape of a Hub model id: "name" or "owner/name", of letters, digits, '_',
// '-' and '.', with no "--" or ".." and no leading '-' or '.'.
bool looks_like_hub_model_id(const std::string& text);

// The snapshot folder of model `id` at `revision` (a branch or tag recorded in refs/, or a commit
// hash) in the cache, as huggingface_hub's snapshot_download(local_files_only=True) finds it; none
// when the cache does not hold it.
std::optional<std::string> cached_hub_snapshot(const std::string& id, const std::string& revision = "main");

// A snapshot folder of the cache, named back: its Hub id ("owner/name") and commit, when the cache
// resolves that id at that commit to this very folder; none for any other folder.
struct CachedHubModel {
    std::string id, commit;
};
std::optional<CachedHubModel> cached_hub_model_of(const std::string& folder);
// The same naming read from the path alone (".../models--OWNER--NAME/snapshots/COMMIT"), whether or
// not the folder is still there: for a snapshot that has left the cache.
std::optional<CachedHubModel> hub_model_named_by_path(const std::string& folder);

// A model folder as the user gave it: `folder` (`given` resolved against the manifest's folder, or
// `given` itself) when it exists; else, when `given` looks like a Hub id the cache holds at
// `revision`, that snapshot; else `folder`, whose loading then reports what is missing.
std::string local_or_cached_model_folder(const std::string& given, const std::string& folder,
                                         const std::string& revision = "main");

// Why `revision` cannot apply to the model `given` (resolved as `folder`), in words that end with
// the fix: a folder takes no revision but main; the cache lacks that revision of a Hub id. Empty
// when it applies.
std::string revision_refusal(const std::string& given, const std::string& folder, const std::string& revision);

}  // namespace grove
