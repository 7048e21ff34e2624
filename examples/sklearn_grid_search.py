"""A scikit-learn grid search spread over a 2-node pool (runs on sky.Local()).

32 candidates x 5 folds = 160 fits. The search runs inside a task on one node; its fits fan
out over every node through the client (the sklearn plugin makes "skyward" joblib's backend
inside tasks too).
"""

import skyward as sky


@sky.function
def search() -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0)
    pipe = Pipeline([("scale", StandardScaler()), ("svc", SVC())])
    grid = {
        "svc__C": [0.1, 1, 10, 100],
        "svc__gamma": ["scale", "auto", 0.01, 0.001],
        "svc__kernel": ["rbf", "poly"],
    }
    found = GridSearchCV(pipe, grid, cv=5, n_jobs=-1).fit(X_train, y_train)
    return {"best": found.best_params_, "cv": found.best_score_, "test": found.score(X_test, y_test)}


if __name__ == "__main__":
    with sky.Compute(nodes=2, plugins=[sky.plugins.sklearn()]) as pool:
        result = search() >> pool
    print(f"best {result['best']}: cv {result['cv']:.3f}, test {result['test']:.3f}")
